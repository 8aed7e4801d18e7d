// pdq-prefill: computes prompts (FP16 or W8A8) and sends their KV caches to
// decode workers, layer by layer while it computes (worker/).
#include "worker/worker_server.h"

int main(int argc, char** argv) {
  return pdq::worker::WorkerMain(argc, argv, "pdq-prefill", pdq::worker::Role::kPrefill);
}
