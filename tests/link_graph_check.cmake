# What the servers link (cmake/link_graph.cmake wrote the closures into DIR):
# each server depends only on what it runs. Run as
#   cmake -DDIR=<build>/link_graph -P tests/link_graph_check.cmake
# A pdq library outside a server's list below fails the check, naming it:
# the harness, the benchmarks, the evaluation metrics and the `pdq` commands
# must not reach a server, the router must not reach the engine, and the
# harness (a client of the servers) reaches neither the engine nor a server;
# the policy (shared by the servers and the simulator) and the simulator
# reach nothing but each other.
cmake_minimum_required(VERSION 3.25)
set(worker_allowed pdq_worker pdq_engine pdq_engine_cuda pdq_device pdq_quant pdq_quant_methods
  pdq_kernels pdq_kernels_cuda pdq_gguf pdq_tokenizer pdq_kvtransfer pdq_server pdq_proto
  pdq_flags pdq_probes pdq_policy pdq_common
  # --emulate: passes timed by a `pdq profile` (emulate/, reading sim/profile.h).
  pdq_emulate pdq_sim)
set(router_allowed pdq_router pdq_policy pdq_tokenizer pdq_gguf pdq_server pdq_proto pdq_flags pdq_common)
# The harness is a client: no engine, no worker, no router.
set(harness_allowed pdq_harness pdq_server pdq_proto pdq_common)
# The policy is pure functions; the simulator runs on it alone.
set(policy_allowed pdq_policy pdq_common)
set(sim_allowed pdq_sim pdq_policy pdq_common)
# name of the closure file, its allowed pdq libraries, one it must contain
# (so an empty or broken walk fails too).
set(checks
  "pdq-prefill|worker_allowed|pdq_engine"
  "pdq-decode|worker_allowed|pdq_kvtransfer"
  "pdq_worker|worker_allowed|pdq_quant"
  "pdq-router|router_allowed|pdq_tokenizer"
  "pdq_router|router_allowed|pdq_server"
  "pdq_harness|harness_allowed|pdq_proto"
  "pdq_policy|policy_allowed|pdq_common"
  "pdq_sim|sim_allowed|pdq_policy")

set(failures 0)
foreach(check IN LISTS checks)
  string(REPLACE "|" ";" parts "${check}")
  list(GET parts 0 name)
  list(GET parts 1 allowed_var)
  list(GET parts 2 required)
  set(path "${DIR}/${name}.txt")
  if(NOT EXISTS "${path}")
    message(SEND_ERROR "${path} is missing: configure the build first")
    math(EXPR failures "${failures} + 1")
    continue()
  endif()
  file(STRINGS "${path}" closure)
  if(NOT required IN_LIST closure)
    message(SEND_ERROR "${name} does not link ${required}: the link walk is broken")
    math(EXPR failures "${failures} + 1")
  endif()
  foreach(lib IN LISTS closure)
    if(lib MATCHES "^pdq_" AND NOT lib IN_LIST ${allowed_var})
      message(SEND_ERROR "${name} links ${lib}, which a server must not depend on")
      math(EXPR failures "${failures} + 1")
    endif()
  endforeach()
  list(FILTER closure INCLUDE REGEX "^pdq_")
  list(JOIN closure " " shown)
  message(STATUS "${name}: ${shown}")
endforeach()
if(failures GREATER 0)
  message(FATAL_ERROR "${failures} link graph check(s) failed")
endif()
