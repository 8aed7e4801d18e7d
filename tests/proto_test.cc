// The pdq.v1 API as compiled: the services have the shapes the design
// needs (streams where tokens stream), the engine's KV layout travels in
// its bytes fields unchanged, and the wire enums name the engine's values.
#include <cctype>

#include "absl/strings/ascii.h"
#include "engine/kv_layout.h"
#include "engine/linear.h"
#include "gtest/gtest.h"
#include "pdq/v1/pdq.grpc.pb.h"
#include "pdq/v1/worker.grpc.pb.h"
#include "tests/test_models.h"

namespace pdq {
namespace {

const google::protobuf::MethodDescriptor* Method(const std::string& service,
                                                 const std::string& method) {
  const auto* s = google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(service);
  if (s == nullptr) {
    ADD_FAILURE() << "no service " << service;
    return nullptr;
  }
  const auto* m = s->FindMethodByName(method);
  if (m == nullptr) ADD_FAILURE() << "no method " << service << "." << method;
  return m;
}

TEST(ProtoTest, TokensStreamWhereTheDesignStreamsThem) {
  struct Expected {
    const char* service;
    const char* method;
    bool server_streaming;
  };
  for (const Expected& e : std::vector<Expected>{
           {"pdq.v1.Pdq", "Generate", true},
           {"pdq.v1.Pdq", "Tokenize", false},
           {"pdq.v1.Pdq", "GetModelInfo", false},
           {"pdq.v1.DecodeWorker", "Reserve", false},
           {"pdq.v1.DecodeWorker", "Decode", true},
           {"pdq.v1.DecodeWorker", "Release", false},
           {"pdq.v1.PrefillWorker", "Prefill", false},
           {"pdq.v1.Registry", "Register", false},
           {"pdq.v1.Registry", "Heartbeat", false},
           {"pdq.v1.Registry", "Deregister", false},
       }) {
    const auto* m = Method(e.service, e.method);
    ASSERT_NE(m, nullptr);
    EXPECT_EQ(m->server_streaming(), e.server_streaming) << e.service << "." << e.method;
    EXPECT_FALSE(m->client_streaming()) << e.service << "." << e.method;
  }
  // The decode stream is the same message the client receives.
  EXPECT_EQ(Method("pdq.v1.DecodeWorker", "Decode")->output_type(),
            Method("pdq.v1.Pdq", "Generate")->output_type());
}

TEST(ProtoTest, KvLayoutTravelsInModelAndWorkerInfo) {
  auto t = testing::LoadOrDie("synthetic:tiny-qwen2");
  ASSERT_TRUE(t);
  const KvLayout layout = t->kv_layout();
  v1::WorkerInfo info;
  info.set_worker_id("decode-0");
  info.set_role(v1::ROLE_DECODE);
  info.set_precision(v1::PRECISION_W4A16);
  info.set_kv_layout(layout.Serialize());
  info.set_block_tokens(layout.block_tokens);
  std::string wire;
  ASSERT_TRUE(info.SerializeToString(&wire));
  v1::WorkerInfo back;
  ASSERT_TRUE(back.ParseFromString(wire));
  auto parsed = KvLayout::Deserialize(back.kv_layout());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, layout);
  EXPECT_EQ(back.role(), v1::ROLE_DECODE);
  // Garbage in the field is refused by the layout's own check, not trusted.
  back.set_kv_layout("not a layout");
  EXPECT_FALSE(KvLayout::Deserialize(back.kv_layout()).ok());
}

// PRECISION_W8A8 on the wire is the engine's "w8a8", and so on.
TEST(ProtoTest, WirePrecisionsNameTheEnginePrecisions) {
  const auto* e = v1::Precision_descriptor();
  int named = 0;
  for (int i = 0; i < e->value_count(); ++i) {
    const std::string name = e->value(i)->name();
    if (e->value(i)->number() == 0) continue;  // PRECISION_UNSPECIFIED
    const std::string engine = absl::AsciiStrToLower(name.substr(std::string("PRECISION_").size()));
    EXPECT_TRUE(ParsePrecision(engine).ok()) << name;
    ++named;
  }
  EXPECT_EQ(named, 3);
}

TEST(ProtoTest, AGenerateRequestRoundTrips) {
  v1::GenerateRequest r;
  r.set_request_id("req-1");
  auto* chat = r.mutable_chat();
  auto* m = chat->add_messages();
  m->set_role("user");
  m->set_content("What is the capital of France?");
  r.mutable_sampling()->set_temperature(0.7f);
  r.set_max_tokens(32);
  r.add_stop("\n\n");
  std::string wire;
  ASSERT_TRUE(r.SerializeToString(&wire));
  v1::GenerateRequest back;
  ASSERT_TRUE(back.ParseFromString(wire));
  EXPECT_EQ(back.prompt_case(), v1::GenerateRequest::kChat);
  EXPECT_EQ(back.chat().messages(0).content(), "What is the capital of France?");
  EXPECT_FLOAT_EQ(back.sampling().temperature(), 0.7f);
  EXPECT_EQ(back.max_tokens(), 32);
  EXPECT_FALSE(back.ParseFromString("\xff\xff\xff"));  // malformed bytes are refused
}

}  // namespace
}  // namespace pdq
