#include "server/grpc_util.h"

#include "absl/strings/str_cat.h"

namespace pdq::server {

grpc::Status ParseRequest(const grpc::ByteBuffer& in, google::protobuf::Message* out) {
  std::vector<grpc::Slice> slices;
  std::string bytes;
  if (in.Dump(&slices).ok()) {
    for (const grpc::Slice& s : slices) bytes.append((const char*)s.begin(), s.size());
  }
  if (!out->ParseFromString(bytes)) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("the request is not a valid ", out->GetTypeName(),
                                     ": a string field holds bytes that are not UTF-8, or the "
                                     "protobuf encoding is malformed"));
  }
  return grpc::Status::OK;
}

grpc::ByteBuffer ToByteBuffer(const google::protobuf::Message& m) {
  const std::string bytes = m.SerializeAsString();
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

}  // namespace pdq::server
