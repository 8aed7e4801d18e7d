// pdq-router: the only service clients talk to (router/router.h).
#include "router/router.h"

int main(int argc, char** argv) { return pdq::router::RouterMain(argc, argv); }
