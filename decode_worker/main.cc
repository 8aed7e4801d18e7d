// pdq-decode: reserves KV blocks, receives KV caches from prefill workers and
// decodes them with continuous batching (W4A16), streaming tokens (worker/).
#include "worker/worker_server.h"

int main(int argc, char** argv) {
  return pdq::worker::WorkerMain(argc, argv, "pdq-decode", pdq::worker::Role::kDecode);
}
