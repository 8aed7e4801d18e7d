// Who may talk to whom (server/security.h), as separate processes: a router
// and two workers under mutual TLS with API keys, certificates made by
// scripts/make_certs.sh. Clients without the key, with a wrong one, without
// TLS or trusting another CA are refused; a peer without a certificate can
// neither register as a worker nor call one; a KV connection with a forged
// token is refused; and after all of it every KV block is free and the
// next request is answered.
#include "server/security.h"

#include <arpa/inet.h>
#include <grpcpp/generic/generic_stub.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdio>
#include <future>
#include <nlohmann/json.hpp>

#include "engine/kv_layout.h"
#include "kvtransfer/wire.h"
#include "serving_cluster.h"

namespace pdq::testing {
namespace {

using json = nlohmann::json;

// The output and exit status of a shell command.
struct ShellRun {
  std::string out;
  int code = -1;
};
ShellRun Shell(const std::string& command) {
  ShellRun r;
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// One CA's files, as scripts/make_certs.sh writes them.
struct Certs {
  std::string dir;
  std::string ca() const { return dir + "/ca.pem"; }
  std::string cert() const { return dir + "/pdq.pem"; }
  std::string key() const { return dir + "/pdq-key.pem"; }
  std::string api_keys() const { return dir + "/api-keys.txt"; }
  std::string api_key() const {  // the file's last line
    std::istringstream in(ReadFile(api_keys()));
    std::string line, last;
    while (std::getline(in, line)) {
      if (!line.empty() && line[0] != '#') last = line;
    }
    return last;
  }
  std::vector<std::string> ServerFlags() const {
    return {"--tls-cert", cert(), "--tls-key", key(), "--tls-ca", ca()};
  }
  server::TlsPem Pem(bool with_identity) const {
    server::TlsPem p;
    p.ca = ReadFile(ca());
    if (with_identity) {
      p.cert = ReadFile(cert());
      p.key = ReadFile(key());
    }
    return p;
  }
};

class SecurityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!std::filesystem::exists(kModel) || Shell("command -v openssl").code != 0) return;
    char tmpl[] = "/tmp/pdq-security-test-XXXXXX";
    dir_ = mkdtemp(tmpl);
    pdq_ = {dir_ + "/pdq"};
    rogue_ = {dir_ + "/rogue"};
    for (const Certs* c : {&pdq_, &rogue_}) {
      const ShellRun r = Shell("scripts/make_certs.sh " + c->dir);
      if (r.code != 0) {
        ADD_FAILURE() << "scripts/make_certs.sh: " << r.out;
        return;
      }
    }
    cluster_ = std::make_unique<Cluster>();
    std::vector<std::string> router_flags = pdq_.ServerFlags();
    health_file_ = dir_ + "/health";
    for (const std::string& f :
         {std::string("--api-key-file"), pdq_.api_keys(), std::string("--worker-tls-name"),
          std::string("pdq-worker"), std::string("--http-listen"), std::string("127.0.0.1:0"),
          std::string("--http-address-file"), dir_ + "/http", std::string("--health-listen"),
          std::string("127.0.0.1:0"), std::string("--health-address-file"), health_file_}) {
      router_flags.push_back(f);
    }
    router_ = cluster_->Router(router_flags);
    if (!router_.ok()) return;
    std::getline(std::ifstream(dir_ + "/http"), http_);
    std::vector<std::string> worker_flags = pdq_.ServerFlags();
    worker_flags.insert(worker_flags.end(), {"--skip-peaks", "--kv-tokens", "4096"});
    prefill_ = cluster_->Worker(router_.address, "prefill", "fp16", worker_flags);
    kv_port_ = FreePort();
    worker_flags.insert(worker_flags.end(),
                        {"--kv-listen", "127.0.0.1:" + std::to_string(kv_port_)});
    decode_ = cluster_->Worker(router_.address, "decode", "fp16", worker_flags);
  }
  static void TearDownTestSuite() {
    cluster_.reset();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  void SetUp() override {
    if (!std::filesystem::exists(kModel)) GTEST_SKIP() << kModel << " not found (make model)";
    if (Shell("command -v openssl").code != 0) {
      GTEST_SKIP() << "openssl is not installed (scripts/install_deps.sh)";
    }
    ASSERT_TRUE(router_.ok() && prefill_.ok() && decode_.ok());
    stub_ = v1::Pdq::NewStub(server::Dial(router_.address, Keyed()));
    ASSERT_TRUE(WaitForWorkers(*stub_, 2));
  }

  // A client holding the CA and the key, as users are given.
  static server::Dialing Keyed() { return {pdq_.Pem(false), "", pdq_.api_key()}; }

  // A worker's load, asked with the shared certificate.
  static absl::StatusOr<v1::WorkerLoad> LoadOf(const std::string& worker,
                                               const server::Dialing& how) {
    auto stub = v1::DecodeWorker::NewStub(server::Dial(worker, how));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::WorkerLoad load;
    const grpc::Status s = stub->GetLoad(&ctx, {}, &load);
    if (!s.ok()) return absl::Status(absl::StatusCode(s.error_code()), s.error_message());
    return load;
  }

  void ExpectAllFree(const Proc& worker, const char* what) {
    const server::Dialing insider{pdq_.Pem(true), "pdq-worker", ""};
    const auto end = Clock::now() + std::chrono::seconds(20);
    absl::StatusOr<v1::WorkerLoad> l = LoadOf(worker.address, insider);
    while (l.ok() && l->kv_blocks_free() != l->kv_blocks_total() && Clock::now() < end) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      l = LoadOf(worker.address, insider);
    }
    ASSERT_TRUE(l.ok()) << what << ": " << l.status();
    EXPECT_EQ(l->kv_blocks_free(), l->kv_blocks_total()) << what;
    EXPECT_EQ(l->active_sequences(), 0) << what;
  }

  static grpc::Status AskModelInfo(const server::Dialing& how, v1::ModelInfo* info = nullptr) {
    auto stub = v1::Pdq::NewStub(server::Dial(router_.address, how));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::ModelInfo unused;
    return stub->GetModelInfo(&ctx, {}, info ? info : &unused);
  }

  static inline std::string dir_, http_, health_file_;
  static inline Certs pdq_, rogue_;
  static inline std::unique_ptr<Cluster> cluster_;
  static inline Proc router_, prefill_, decode_;
  static inline int kv_port_ = 0;
  std::unique_ptr<v1::Pdq::Stub> stub_;
};

TEST_F(SecurityTest, AKeyedClientTrustingTheCaIsServedAcrossMutualTls) {
  v1::GenerateRequest req = Chat(kPrompts[0], 8);
  req.set_ignore_eos(true);
  const Answer a = Generate(*stub_, req);
  ASSERT_TRUE(a.status.ok()) << a.status.error_message();
  EXPECT_EQ(a.tokens.size(), 8u);
  ExpectAllFree(decode_, "decode worker");
}

// pdq eval blind-ab reaches a TLS router that wants a key (router=HOST:PORT
// with the client flags every command shares), and fails clearly without.
TEST_F(SecurityTest, TheBlindReviewReachesATlsRouterWithItsKey) {
  const std::string prompts = dir_ + "/review-prompts.txt";
  std::ofstream(prompts) << "Hello there\nName a colour\n";
  const std::string pdq = std::string(PDQ_BIN_DIR) + "/pdq eval blind-ab --prompts " + prompts +
                          " --a router=" + router_.address + " --b router=" + router_.address +
                          " --max-tokens 4 --tls-ca " + pdq_.ca() + " --out " + dir_ + "/review";
  ShellRun r = Shell(pdq + " --api-key " + pdq_.api_key());
  ASSERT_EQ(r.code, 0) << r.out;
  std::ifstream answers(dir_ + "/review/answers.json");
  const nlohmann::json j = nlohmann::json::parse(answers, nullptr, false);
  ASSERT_TRUE(j.is_object()) << r.out;
  EXPECT_EQ(j["answers"].size(), 2u);
  r = Shell("env -u PDQ_API_KEY " + pdq);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("API key is required"), std::string::npos) << r.out;
}

TEST_F(SecurityTest, ClientsWithoutTheKeyOrWithAWrongOneAreRefused) {
  server::Dialing no_key = Keyed(), wrong_key = Keyed();
  no_key.api_key.clear();
  wrong_key.api_key = "0123456789abcdef0123456789abcdef";
  for (const server::Dialing& how : {no_key, wrong_key}) {
    SCOPED_TRACE(how.api_key.empty() ? "no key" : "wrong key");
    EXPECT_EQ(AskModelInfo(how).error_code(), grpc::StatusCode::UNAUTHENTICATED);
    auto stub = v1::Pdq::NewStub(server::Dial(router_.address, how));
    const Answer a = Generate(*stub, Chat(kPrompts[0], 8));
    EXPECT_EQ(a.status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_TRUE(a.tokens.empty());
    grpc::ClientContext ctx;
    v1::TokenizeRequest req;
    req.set_text("hello");
    v1::TokenizeResponse resp;
    EXPECT_EQ(stub->Tokenize(&ctx, req, &resp).error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(resp.ids_size(), 0);
  }
  EXPECT_NE(AskModelInfo(no_key).error_message().find("API key is required"), std::string::npos);
  EXPECT_NE(AskModelInfo(wrong_key).error_message().find("not valid"), std::string::npos);
}

TEST_F(SecurityTest, PlaintextAndAnotherCasCertificatesFailTheHandshake) {
  server::Dialing plaintext = Keyed(), rogue = Keyed();
  plaintext.tls.reset();
  rogue.tls = rogue_.Pem(false);  // trusts another CA: the router's certificate fails
  EXPECT_EQ(AskModelInfo(plaintext).error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(AskModelInfo(rogue).error_code(), grpc::StatusCode::UNAVAILABLE);
}

TEST_F(SecurityTest, OnlyCertificateHoldersMayRegisterOrCallWorkers) {
  // TLS and the API key, but no certificate: a client, not a worker.
  auto registry = v1::Registry::NewStub(server::Dial(router_.address, Keyed()));
  v1::ModelInfo before;
  ASSERT_TRUE(AskModelInfo(Keyed(), &before).ok());
  ASSERT_EQ(before.workers_size(), 2);
  {
    grpc::ClientContext ctx;
    v1::RegisterRequest req;
    v1::WorkerInfo* w = req.mutable_worker();
    w->set_worker_id("impostor");
    w->set_role(v1::ROLE_DECODE);
    w->set_precision(v1::PRECISION_FP16);
    w->set_address("127.0.0.1:1");
    w->set_kv_address("127.0.0.1:1");
    w->set_vocab_size(before.vocab_size());
    w->set_max_context(before.max_context());
    w->set_kv_layout(before.kv_layout());
    v1::RegisterResponse resp;
    const grpc::Status s = registry->Register(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << s.error_message();
  }
  for (const v1::WorkerStatus& w : before.workers()) {
    grpc::ClientContext ctx;
    v1::DeregisterRequest req;
    req.set_worker_id(w.worker_id());
    v1::DeregisterResponse resp;
    EXPECT_EQ(registry->Deregister(&ctx, req, &resp).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
  // A worker that trusts the router but whose certificate another CA
  // signed never gets in.
  const std::vector<std::string> rogue_flags = {"--tls-cert",   rogue_.cert(), "--tls-key",
                                                rogue_.key(),   "--tls-ca",    pdq_.ca(),
                                                "--skip-peaks", "--kv-tokens", "1024"};
  const Proc rogue = cluster_->Worker(router_.address, "decode", "fp16", rogue_flags);
  ASSERT_TRUE(rogue.ok());
  std::this_thread::sleep_for(std::chrono::seconds(2));  // several registration attempts
  v1::ModelInfo after;
  ASSERT_TRUE(AskModelInfo(Keyed(), &after).ok());
  EXPECT_EQ(after.workers_size(), 2);
  for (const v1::WorkerStatus& w : after.workers()) {
    EXPECT_NE(w.address(), rogue.address) << "the rogue worker registered";
  }
  cluster_->Kill(rogue);

  // Workers answer only holders of a certificate their CA signed.
  const server::Dialing insider{pdq_.Pem(true), "pdq-worker", ""},
      no_cert{pdq_.Pem(false), "pdq-worker", ""}, outsider{rogue_.Pem(true), "pdq-worker", ""};
  EXPECT_TRUE(LoadOf(decode_.address, insider).ok());
  EXPECT_EQ(LoadOf(decode_.address, no_cert).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(LoadOf(decode_.address, outsider).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(LoadOf(prefill_.address, server::Dialing{}).status().code(),
            absl::StatusCode::kUnavailable);
  const Answer a = Generate(*stub_, Chat(kPrompts[1], 8));
  EXPECT_TRUE(a.status.ok()) << a.status.error_message();
}

TEST_F(SecurityTest, AForgedKvConnectionIsRefusedAndNothingLeaks) {
  v1::ModelInfo info;
  ASSERT_TRUE(AskModelInfo(Keyed(), &info).ok());
  absl::StatusOr<KvLayout> layout = KvLayout::Deserialize(info.kv_layout());
  ASSERT_TRUE(layout.ok()) << layout.status();
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(kv_port_);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  // A well-formed hello, the right layout, a guessed token.
  const std::string hello = kvtransfer::wire::EncodeHello("PDQKVTCP", *layout, "req-1/guessed");
  ASSERT_EQ(send(fd, hello.data(), hello.size(), MSG_NOSIGNAL), (ssize_t)hello.size());
  std::string reply;
  char buf[4096];
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  for (ssize_t n; (n = recv(fd, buf, sizeof buf, 0)) > 0;) reply.append(buf, n);
  close(fd);
  ASSERT_GE(reply.size(), kvtransfer::wire::kStatusHeadBytes);
  const absl::Status refused = kvtransfer::wire::DecodeStatus(
      reply.data(), reply.substr(kvtransfer::wire::kStatusHeadBytes));
  EXPECT_EQ(refused.code(), absl::StatusCode::kPermissionDenied) << refused;
  ExpectAllFree(decode_, "decode worker");
  const Answer after = Generate(*stub_, Chat(kPrompts[2], 8));
  EXPECT_TRUE(after.status.ok()) << after.status.error_message();
}

TEST_F(SecurityTest, TheHttpApiIsHttpsAndNeedsTheKey) {
  httplib::Client https("https://" + http_);
  https.set_ca_cert_path(pdq_.ca().c_str());
  httplib::Result r = https.Get("/v1/models");
  ASSERT_TRUE(r) << httplib::to_string(r.error());
  EXPECT_EQ(r->status, 401);
  const json error = json::parse(r->body, nullptr, false);
  EXPECT_TRUE(error.contains("error")) << r->body;
  r = https.Get("/v1/models", {{"Authorization", "Bearer 0123456789abcdef0123456789abcdef"}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);
  // A byte gRPC metadata cannot carry (a tab) is refused, not passed on.
  r = https.Get("/v1/models", {{"Authorization", "Bearer abc\tdef"}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401) << r->body;
  const httplib::Headers keyed = {{"Authorization", "Bearer " + pdq_.api_key()}};
  r = https.Get("/v1/models", keyed);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  const std::string body =
      json({{"model", json::parse(r->body)["data"][0]["id"]}, {"prompt", "Hi"}, {"max_tokens", 4}})
          .dump();
  r = https.Post("/v1/completions", keyed, body, "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  r = https.Post("/v1/completions", body, "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401) << r->body;
  // Plain HTTP on the HTTPS port gets no answer.
  httplib::Client plain("http://" + http_);
  plain.set_read_timeout(5);
  r = plain.Get("/v1/models", keyed);
  EXPECT_TRUE(!r || r->status != 200);
  // A client trusting another CA does not connect.
  httplib::Client outsider("https://" + http_);
  outsider.set_ca_cert_path(rogue_.ca().c_str());
  EXPECT_FALSE(outsider.Get("/v1/models", keyed));
}

TEST_F(SecurityTest, TheHealthPortAnswersInPlaintextAndServesNothingElse) {
  std::string health;
  std::getline(std::ifstream(health_file_), health);
  ASSERT_FALSE(health.empty());
  const ShellRun r = Shell(std::string(PDQ_BIN_DIR) + "/pdq status --router " + health);
  // pdq status asks GetModelInfo, which that port does not serve.
  EXPECT_NE(r.out.find("(12)"), std::string::npos) << r.out;  // UNIMPLEMENTED
  auto channel = grpc::CreateChannel(health, grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::Slice none("", 0);
  const grpc::ByteBuffer request(&none, 1);
  grpc::ByteBuffer response;
  std::promise<grpc::Status> done;
  stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                 [&done](grpc::Status s) { done.set_value(std::move(s)); });
  const grpc::Status s = done.get_future().get();
  ASSERT_TRUE(s.ok()) << s.error_message();
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(response.Dump(&slices).ok());
  std::string bytes;
  for (const grpc::Slice& sl : slices) bytes.append((const char*)sl.begin(), sl.size());
  EXPECT_EQ(bytes, std::string("\x08\x01", 2));  // SERVING
}

TEST_F(SecurityTest, MisconfiguredCertificatesAndKeysAreClearErrors) {
  const std::string router = std::string(PDQ_BIN_DIR) + "/pdq-router --model " + kModel;
  ShellRun r = Shell(router + " --tls-cert " + pdq_.cert());
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("--tls-cert, --tls-key and --tls-ca go together"), std::string::npos)
      << r.out;
  r = Shell(router + " --tls-cert README.md --tls-key " + pdq_.key() + " --tls-ca " + pdq_.ca());
  EXPECT_NE(r.out.find("--tls-cert: README.md is not a PEM file"), std::string::npos) << r.out;
  r = Shell(router + " --tls-cert " + pdq_.cert() + " --tls-key " + pdq_.key() +
            " --tls-ca /nonexistent.pem");
  EXPECT_NE(r.out.find("--tls-ca: cannot read /nonexistent.pem"), std::string::npos) << r.out;
  r = Shell(router + " --api-key-file README.md");
  EXPECT_NE(r.out.find("a key has 16 to 256 printable ASCII characters"), std::string::npos)
      << r.out;
  r = Shell(std::string(PDQ_BIN_DIR) + "/pdq-decode --tls-cert " + pdq_.cert() + " --tls-key " +
            pdq_.key() + " --tls-ca /nonexistent.pem");
  EXPECT_NE(r.out.find("--tls-ca: cannot read /nonexistent.pem"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace pdq::testing
