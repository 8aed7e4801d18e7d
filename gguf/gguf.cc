// GGUF parsing with bounds checks on every read: a truncated or corrupt file
// becomes an InvalidArgument naming the offset and the field, never a crash.
#include "gguf/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/check.h"

namespace pdq {
namespace {

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" read little-endian
constexpr uint64_t kMaxStringBytes = 1ull << 30;
constexpr uint32_t kMaxDims = 4;

enum ValueType : uint32_t {
  kU8 = 0, kI8 = 1, kU16 = 2, kI16 = 3, kU32 = 4, kI32 = 5, kF32 = 6,
  kBool = 7, kString = 8, kArray = 9, kU64 = 10, kI64 = 11, kF64 = 12,
};

// Sequential little-endian reader over [data, data + size).
class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  size_t pos() const { return pos_; }
  size_t remaining() const { return size_ - pos_; }

  template <typename T>
  absl::Status Read(T* out, const char* what) {
    if (remaining() < sizeof(T)) return Truncated(what);
    std::memcpy(out, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return absl::OkStatus();
  }

  absl::Status ReadString(std::string* out, const char* what) {
    uint64_t len = 0;
    PDQ_RETURN_IF_ERROR(Read(&len, what));
    if (len > kMaxStringBytes || len > remaining()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "GGUF ", what, " at offset ", pos_ - 8, " has length ", len,
          " but only ", remaining(), " bytes remain (truncated or corrupt file)"));
    }
    out->assign(reinterpret_cast<const char*>(data_ + pos_), len);
    pos_ += len;
    return absl::OkStatus();
  }

  absl::Status Truncated(const char* what) const {
    return absl::InvalidArgumentError(absl::StrCat(
        "GGUF file truncated: cannot read ", what, " at offset ", pos_, " (file has ",
        size_, " bytes)"));
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

absl::Status ReadScalar(Reader& r, uint32_t type, GgufValue* out) {
  switch (type) {
    case kU8: { uint8_t v = 0; PDQ_RETURN_IF_ERROR(r.Read(&v, "u8 value")); *out = (uint64_t)v; break; }
    case kI8: { int8_t v = 0; PDQ_RETURN_IF_ERROR(r.Read(&v, "i8 value")); *out = (int64_t)v; break; }
    case kU16: { uint16_t v = 0; PDQ_RETURN_IF_ERROR(r.Read(&v, "u16 value")); *out = (uint64_t)v; break; }
    case kI16: { int16_t v = 0; PDQ_RETURN_IF_ERROR(r.Read(&v, "i16 value")); *out = (int64_t)v; break; }
    case kU32: { uint32_t v = 0; PDQ_RETURN_IF_ERROR(r.Read(&v, "u32 value")); *out = (uint64_t)v; break; }
    case kI32: { int32_t v = 0; PDQ_RETURN_IF_ERROR(r.Read(&v, "i32 value")); *out = (int64_t)v; break; }
    case kU64: { uint64_t v = 0; PDQ_RETURN_IF_ERROR(r.Read(&v, "u64 value")); *out = v; break; }
    case kI64: { int64_t v = 0; PDQ_RETURN_IF_ERROR(r.Read(&v, "i64 value")); *out = v; break; }
    case kF32: { float v = 0; PDQ_RETURN_IF_ERROR(r.Read(&v, "f32 value")); *out = (double)v; break; }
    case kF64: { double v = 0; PDQ_RETURN_IF_ERROR(r.Read(&v, "f64 value")); *out = v; break; }
    case kBool: {
      uint8_t v = 0;
      PDQ_RETURN_IF_ERROR(r.Read(&v, "bool value"));
      if (v > 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("GGUF bool at offset ", r.pos() - 1, " has value ", (int)v));
      }
      *out = v != 0;
      break;
    }
    case kString: {
      std::string s;
      PDQ_RETURN_IF_ERROR(r.ReadString(&s, "string value"));
      *out = std::move(s);
      break;
    }
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("GGUF metadata value type ", type, " is unknown (offset ", r.pos(), ")"));
  }
  return absl::OkStatus();
}

absl::Status ReadValue(Reader& r, uint32_t type, GgufValue* out) {
  if (type != kArray) return ReadScalar(r, type, out);
  auto array = std::make_shared<GgufArray>();
  uint64_t count = 0;
  PDQ_RETURN_IF_ERROR(r.Read(&array->elem_type, "array element type"));
  PDQ_RETURN_IF_ERROR(r.Read(&count, "array length"));
  if (array->elem_type == kArray) {
    return absl::InvalidArgumentError("GGUF nested arrays are not supported");
  }
  if (array->elem_type > kF64) {
    return absl::InvalidArgumentError(
        absl::StrCat("GGUF array element type ", array->elem_type, " is unknown"));
  }
  // Each element needs at least its encoded size (8 for a string's length),
  // which bounds the allocation by the bytes left in the file.
  static constexpr uint64_t kMinBytes[] = {1, 1, 2, 2, 4, 4, 4, 1, 8, 0, 8, 8, 8};
  if (count > r.remaining() / kMinBytes[array->elem_type]) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GGUF array at offset ", r.pos(), " claims ", count, " elements but only ",
        r.remaining(), " bytes remain (truncated or corrupt file)"));
  }
  array->items.resize(count);
  for (uint64_t i = 0; i < count; ++i) {
    PDQ_RETURN_IF_ERROR(ReadScalar(r, array->elem_type, &array->items[i]));
  }
  *out = std::move(array);
  return absl::OkStatus();
}

absl::Status TypeMismatch(std::string_view key, const char* want) {
  return absl::InvalidArgumentError(
      absl::StrCat("GGUF key '", std::string(key), "' is not ", want));
}

bool AsInt(const GgufValue& v, int64_t* out) {
  if (auto* u = std::get_if<uint64_t>(&v)) {
    if (*u > (uint64_t)INT64_MAX) return false;
    *out = (int64_t)*u;
    return true;
  }
  if (auto* i = std::get_if<int64_t>(&v)) {
    *out = *i;
    return true;
  }
  return false;
}

}  // namespace

std::string GgmlTypeName(GgmlType type) {
  switch (type) {
    case GgmlType::kF32: return "F32";
    case GgmlType::kF16: return "F16";
    case GgmlType::kQ4_0: return "Q4_0";
    case GgmlType::kQ4_1: return "Q4_1";
    case GgmlType::kQ5_0: return "Q5_0";
    case GgmlType::kQ5_1: return "Q5_1";
    case GgmlType::kQ8_0: return "Q8_0";
    case GgmlType::kQ8_1: return "Q8_1";
    case GgmlType::kQ2_K: return "Q2_K";
    case GgmlType::kQ3_K: return "Q3_K";
    case GgmlType::kQ4_K: return "Q4_K";
    case GgmlType::kQ5_K: return "Q5_K";
    case GgmlType::kQ6_K: return "Q6_K";
    case GgmlType::kQ8_K: return "Q8_K";
    case GgmlType::kBF16: return "BF16";
  }
  return absl::StrCat("type(", (uint32_t)type, ")");
}

bool GgmlTypeBlockInfo(GgmlType type, int64_t* block_elems, int64_t* block_bytes) {
  int64_t e = 0, b = 0;
  switch (type) {
    case GgmlType::kF32: e = 1; b = 4; break;
    case GgmlType::kF16: e = 1; b = 2; break;
    case GgmlType::kBF16: e = 1; b = 2; break;
    case GgmlType::kQ4_0: e = 32; b = 18; break;
    case GgmlType::kQ4_1: e = 32; b = 20; break;
    case GgmlType::kQ5_0: e = 32; b = 22; break;
    case GgmlType::kQ5_1: e = 32; b = 24; break;
    case GgmlType::kQ8_0: e = 32; b = 34; break;
    case GgmlType::kQ4_K: e = 256; b = 144; break;
    case GgmlType::kQ5_K: e = 256; b = 176; break;
    case GgmlType::kQ6_K: e = 256; b = 210; break;
    default: return false;
  }
  *block_elems = e;
  *block_bytes = b;
  return true;
}

int64_t GgufTensor::num_elements() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    std::string msg = absl::StrCat("cannot open model file '", path, "': ", std::strerror(err));
    if (err == ENOENT) return absl::NotFoundError(msg);
    if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(msg);
    return absl::InvalidArgumentError(msg);
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat("'", path, "' is not a regular file"));
  }
  std::unique_ptr<GgufFile> file(new GgufFile());
  file->path_ = path;
  file->size_ = (size_t)st.st_size;
  if (file->size_ > 0) {
    void* m = ::mmap(nullptr, file->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return absl::InternalError(
          absl::StrCat("cannot map '", path, "': ", std::strerror(err)));
    }
    file->mapping_ = m;
    file->base_ = static_cast<const uint8_t*>(m);
  }
  ::close(fd);
  absl::Status s = file->Parse();
  if (!s.ok()) {
    return absl::Status(s.code(), absl::StrCat("'", path, "': ", s.message()));
  }
  return file;
}

void GgufFile::DropPages(const GgufTensor& t) const {
  if (mapping_ == nullptr || t.data == nullptr || t.nbytes == 0) return;
  const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
  const uintptr_t begin = ((uintptr_t)t.data + page - 1) / page * page;
  const uintptr_t end = ((uintptr_t)t.data + t.nbytes) / page * page;
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::FromBuffer(std::string_view bytes) {
  std::unique_ptr<GgufFile> file(new GgufFile());
  file->path_ = "<memory>";
  file->owned_.assign(bytes.data(), bytes.size());
  file->base_ = reinterpret_cast<const uint8_t*>(file->owned_.data());
  file->size_ = file->owned_.size();
  PDQ_RETURN_IF_ERROR(file->Parse());
  return file;
}

GgufFile::~GgufFile() {
  if (mapping_ != nullptr) ::munmap(mapping_, size_);
}

absl::Status GgufFile::Parse() {
  Reader r(base_, size_);
  uint32_t magic = 0;
  if (size_ < 4) return absl::InvalidArgumentError("not a GGUF file: shorter than its magic");
  PDQ_RETURN_IF_ERROR(r.Read(&magic, "magic"));
  if (magic != kGgufMagic) {
    return absl::InvalidArgumentError("not a GGUF file: bad magic (expected 'GGUF')");
  }
  PDQ_RETURN_IF_ERROR(r.Read(&version_, "version"));
  if (version_ != 2 && version_ != 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported GGUF version ", version_, " (pdq reads versions 2 and 3)"));
  }
  uint64_t tensor_count = 0, kv_count = 0;
  PDQ_RETURN_IF_ERROR(r.Read(&tensor_count, "tensor count"));
  PDQ_RETURN_IF_ERROR(r.Read(&kv_count, "metadata count"));
  // A metadata entry takes at least 13 bytes and a tensor entry 32; larger
  // counts cannot fit in the file, which bounds the allocations below.
  if (kv_count > r.remaining() / 13 || tensor_count > r.remaining() / 32) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GGUF header claims ", kv_count, " metadata entries and ", tensor_count,
        " tensors, more than a ", size_, "-byte file can hold"));
  }
  keys_.reserve(kv_count);
  for (uint64_t i = 0; i < kv_count; ++i) {
    std::string key;
    uint32_t type = 0;
    PDQ_RETURN_IF_ERROR(r.ReadString(&key, "metadata key"));
    PDQ_RETURN_IF_ERROR(r.Read(&type, "metadata value type"));
    GgufValue value;
    absl::Status s = ReadValue(r, type, &value);
    if (!s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("metadata '", key, "': ", s.message()));
    }
    if (!kv_.emplace(key, std::move(value)).second) {
      return absl::InvalidArgumentError(absl::StrCat("duplicate GGUF metadata key '", key, "'"));
    }
    keys_.push_back(std::move(key));
  }

  uint64_t alignment = 32;
  if (const GgufValue* v = Find("general.alignment")) {
    int64_t a;
    if (!AsInt(*v, &a) || a <= 0 || (a & (a - 1)) != 0 || a > (1 << 20)) {
      return absl::InvalidArgumentError("general.alignment must be a power of two");
    }
    alignment = (uint64_t)a;
  }

  tensors_.resize(tensor_count);
  for (uint64_t i = 0; i < tensor_count; ++i) {
    GgufTensor& t = tensors_[i];
    PDQ_RETURN_IF_ERROR(r.ReadString(&t.name, "tensor name"));
    uint32_t n_dims = 0;
    PDQ_RETURN_IF_ERROR(r.Read(&n_dims, "tensor rank"));
    if (n_dims == 0 || n_dims > kMaxDims) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", t.name, "' has rank ", n_dims, " (expected 1 to ", kMaxDims, ")"));
    }
    t.dims.resize(n_dims);
    uint64_t elems = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      uint64_t dim = 0;
      PDQ_RETURN_IF_ERROR(r.Read(&dim, "tensor dimension"));
      if (dim == 0 || dim > (1ull << 40) || elems > (1ull << 50) / dim) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor '", t.name, "' has an invalid dimension ", dim));
      }
      elems *= dim;
      t.dims[d] = (int64_t)dim;
    }
    uint32_t type = 0;
    PDQ_RETURN_IF_ERROR(r.Read(&type, "tensor type"));
    t.type = (GgmlType)type;
    PDQ_RETURN_IF_ERROR(r.Read(&t.offset, "tensor offset"));
    int64_t block_elems, block_bytes;
    if (!GgmlTypeBlockInfo(t.type, &block_elems, &block_bytes)) {
      return absl::UnimplementedError(absl::StrCat(
          "tensor '", t.name, "' has type ", GgmlTypeName(t.type),
          ", which pdq cannot read (supported: F32 F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q4_K Q5_K Q6_K)"));
    }
    if (t.dims[0] % block_elems != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", t.name, "' row length ", t.dims[0], " is not a multiple of the ",
          GgmlTypeName(t.type), " block size ", block_elems));
    }
    t.nbytes = elems / block_elems * block_bytes;
    if (t.offset % alignment != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", t.name, "' offset ", t.offset, " is not aligned to ", alignment));
    }
    if (!tensor_index_.emplace(t.name, i).second) {
      return absl::InvalidArgumentError(absl::StrCat("duplicate tensor name '", t.name, "'"));
    }
  }
  const uint64_t data_start = (r.pos() + alignment - 1) / alignment * alignment;
  for (GgufTensor& t : tensors_) {
    if (data_start > size_ || t.offset > size_ - data_start ||
        t.nbytes > size_ - data_start - t.offset) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", t.name, "' data [", t.offset, ", ", t.offset + t.nbytes,
          ") runs past the end of the file (truncated file?)"));
    }
    t.data = base_ + data_start + t.offset;
  }
  return absl::OkStatus();
}

bool GgufFile::Has(std::string_view key) const { return kv_.contains(absl::string_view(key.data(), key.size())); }

const GgufValue* GgufFile::Find(std::string_view key) const {
  auto it = kv_.find(absl::string_view(key.data(), key.size()));
  return it == kv_.end() ? nullptr : &it->second;
}

const GgufTensor* GgufFile::FindTensor(std::string_view name) const {
  auto it = tensor_index_.find(absl::string_view(name.data(), name.size()));
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

namespace {
absl::Status Missing(std::string_view key) {
  return absl::NotFoundError(absl::StrCat("GGUF key '", std::string(key), "' is missing"));
}
}  // namespace

absl::StatusOr<std::string> GgufFile::GetString(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return Missing(key);
  if (auto* s = std::get_if<std::string>(v)) return *s;
  return TypeMismatch(key, "a string");
}

absl::StatusOr<int64_t> GgufFile::GetInt(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return Missing(key);
  int64_t out;
  if (AsInt(*v, &out)) return out;
  return TypeMismatch(key, "an integer");
}

absl::StatusOr<double> GgufFile::GetFloat(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return Missing(key);
  if (auto* d = std::get_if<double>(v)) return *d;
  int64_t i;
  if (AsInt(*v, &i)) return (double)i;
  return TypeMismatch(key, "a number");
}

absl::StatusOr<bool> GgufFile::GetBool(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return Missing(key);
  if (auto* b = std::get_if<bool>(v)) return *b;
  return TypeMismatch(key, "a bool");
}

absl::StatusOr<std::vector<std::string>> GgufFile::GetStringArray(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return Missing(key);
  auto* a = std::get_if<std::shared_ptr<GgufArray>>(v);
  if (a == nullptr || (*a)->elem_type != kString) return TypeMismatch(key, "an array of strings");
  std::vector<std::string> out;
  out.reserve((*a)->items.size());
  for (const GgufValue& item : (*a)->items) out.push_back(std::get<std::string>(item));
  return out;
}

absl::StatusOr<std::vector<int64_t>> GgufFile::GetIntArray(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return Missing(key);
  auto* a = std::get_if<std::shared_ptr<GgufArray>>(v);
  if (a == nullptr) return TypeMismatch(key, "an array of integers");
  std::vector<int64_t> out((*a)->items.size());
  for (size_t i = 0; i < out.size(); ++i) {
    if (!AsInt((*a)->items[i], &out[i])) return TypeMismatch(key, "an array of integers");
  }
  return out;
}

absl::StatusOr<std::vector<double>> GgufFile::GetFloatArray(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return Missing(key);
  auto* a = std::get_if<std::shared_ptr<GgufArray>>(v);
  if (a == nullptr) return TypeMismatch(key, "an array of numbers");
  std::vector<double> out((*a)->items.size());
  for (size_t i = 0; i < out.size(); ++i) {
    const GgufValue& item = (*a)->items[i];
    int64_t iv;
    if (auto* d = std::get_if<double>(&item)) {
      out[i] = *d;
    } else if (AsInt(item, &iv)) {
      out[i] = (double)iv;
    } else {
      return TypeMismatch(key, "an array of numbers");
    }
  }
  return out;
}

}  // namespace pdq
