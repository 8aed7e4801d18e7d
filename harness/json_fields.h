// Internal to pdq::harness: JSON for plain structs whose fields are listed
// once. A type provides `void Fields(auto& f, T& v)` calling `f("key",
// v.member)` for each field (`f.Optional(...)` for one written only when
// it is not its type's default or empty), most simply as
//   static void Fields(auto& f, T& v) { PDQ_JSON_EACH(a, b, c) }
// with the members' names as the keys; WriteFields and ReadFields then
// serve as its to_json and from_json.
//
// Writing leaves out numbers that are not finite (not measured). Reading
// is lenient: a missing or null field keeps the struct's default. A field
// of the wrong type throws FieldError with its path ("levels.ttft_s.p50 has
// the wrong type ..."); ReadFieldsOrError turns that into a status.
#pragma once

#include <cmath>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

// f("m", v.m) for each member m; PDQ_JSON_EACH_OPTIONAL: f.Optional(...).
// (nlohmann's own variadic expansion, which its NLOHMANN_DEFINE_TYPE_*
// macros use; those write NaN as null and throw on a missing field.)
#define PDQ_JSON_KEY(m) f(#m, v.m);
#define PDQ_JSON_OPTIONAL_KEY(m) f.Optional(#m, v.m);
#define PDQ_JSON_EACH(...) NLOHMANN_JSON_EXPAND(NLOHMANN_JSON_PASTE(PDQ_JSON_KEY, __VA_ARGS__))
#define PDQ_JSON_EACH_OPTIONAL(...) \
  NLOHMANN_JSON_EXPAND(NLOHMANN_JSON_PASTE(PDQ_JSON_OPTIONAL_KEY, __VA_ARGS__))

namespace pdq::json_fields {

using json = nlohmann::json;

struct FieldError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Reads `key` into `out` where present and not null.
template <typename T>
void Get(const json& j, const char* key, T& out) {
  if (!j.is_object()) return;
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return;
  try {
    it->get_to(out);
  } catch (const FieldError& e) {
    throw FieldError(absl::StrCat(key, ".", e.what()));
  } catch (const json::exception&) {
    throw FieldError(absl::StrCat(key, " has the wrong type (", it->dump(), ")"));
  }
}

struct Writer {
  json& j;
  void operator()(const char* key, double v) {
    if (std::isfinite(v)) j[key] = v;
  }
  template <typename T>
  void operator()(const char* key, const std::optional<T>& v) {
    if (v) j[key] = *v;
  }
  template <typename T>
  void operator()(const char* key, const T& v) {
    j[key] = v;
  }
  template <typename T>
  void Optional(const char* key, const T& v) {
    if constexpr (requires { v.empty(); }) {
      if (!v.empty()) (*this)(key, v);
    } else if (!(v == T{})) {
      (*this)(key, v);
    }
  }
};

struct Reader {
  const json& j;
  template <typename T>
  void operator()(const char* key, std::optional<T>& v) {
    if (j.is_object() && j.contains(key) && !j[key].is_null()) Get(j, key, v.emplace());
  }
  template <typename T>
  void operator()(const char* key, T& v) {
    Get(j, key, v);
  }
  template <typename T>
  void Optional(const char* key, T& v) {
    (*this)(key, v);
  }
};

// The writer only reads the fields; Fields takes them mutable for the reader.
template <typename T>
void WriteFields(json& j, const T& v) {
  j = json::object();
  Writer w{j};
  Fields(w, const_cast<T&>(v));
}

template <typename T>
void ReadFields(const json& j, T& v) {
  Reader r{j};
  Fields(r, v);
}

// ReadFields, a wrong type as InvalidArgument: `where` then the field's path.
template <typename T>
absl::Status ReadFieldsOrError(const json& j, T& v, const std::string& where) {
  try {
    ReadFields(j, v);
  } catch (const FieldError& e) {
    return absl::InvalidArgumentError(absl::StrCat(where, e.what()));
  }
  return absl::OkStatus();
}

}  // namespace pdq::json_fields
