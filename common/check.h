// Invariant checks for pdq: bugs abort with file and line. Never use these on
// anything the outside world controls; return absl::Status for that instead.
#pragma once

#include <cstdio>
#include <cstdlib>

#define PDQ_CHECK(cond)                                                   \
  do {                                                                    \
    if (__builtin_expect(!(cond), 0)) {                                   \
      std::fprintf(stderr, "%s:%d: PDQ_CHECK failed: %s\n", __FILE__,     \
                   __LINE__, #cond);                                      \
      std::abort();                                                       \
    }                                                                     \
  } while (0)

// Propagates a non-OK absl::Status (or the status of a StatusOr) to the caller.
#define PDQ_RETURN_IF_ERROR(expr)               \
  do {                                          \
    auto _pdq_status = (expr);                  \
    if (!_pdq_status.ok()) return _pdq_status;  \
  } while (0)

#define PDQ_CONCAT_INNER(a, b) a##b
#define PDQ_CONCAT(a, b) PDQ_CONCAT_INNER(a, b)
#define PDQ_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return tmp.status();             \
  lhs = std::move(*tmp)
// `PDQ_ASSIGN_OR_RETURN(auto x, MaybeX());` binds x or returns the error.
#define PDQ_ASSIGN_OR_RETURN(lhs, expr) \
  PDQ_ASSIGN_OR_RETURN_IMPL(PDQ_CONCAT(_pdq_statusor_, __LINE__), lhs, expr)
