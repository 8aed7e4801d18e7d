#include "server/response_stream.h"

#include "server/grpc_util.h"

namespace pdq::server {

class ResponseStream::Impl : public ResponseStream::Reactor {
 public:
  explicit Impl(std::shared_ptr<ResponseStream> s) : s_(std::move(s)) {}
  void OnWriteDone(bool ok) override {
    std::function<void()> notify;
    {
      std::unique_lock lock(s_->mu_);
      notify = s_->on_change_;
      s_->writing_ = false;
      s_->unsent_ -= s_->in_flight_tokens_;
      s_->in_flight_tokens_ = 0;
      if (!ok) {
        s_->cancelled_ = true;
        s_->queue_.clear();
      }
      s_->Pump(lock);
    }
    if (notify) notify();
  }
  void OnCancel() override {
    s_->cancelled_ = true;
    std::function<void()> notify;
    {
      std::lock_guard lock(s_->mu_);
      notify = s_->on_change_;
    }
    if (notify) notify();
  }
  void OnDone() override {
    {
      std::lock_guard lock(s_->mu_);
      s_->reactor_ = nullptr;
      s_->on_change_ = nullptr;
    }
    delete this;
  }

 private:
  std::shared_ptr<ResponseStream> s_;
};

std::pair<ResponseStream::Reactor*, std::shared_ptr<ResponseStream>> ResponseStream::Create(
    std::function<void()> on_change) {
  auto s = std::shared_ptr<ResponseStream>(new ResponseStream());
  s->on_change_ = std::move(on_change);
  auto* impl = new Impl(s);
  s->reactor_ = impl;
  return {impl, s};
}

void ResponseStream::SendDelta(const std::vector<int32_t>& ids, const std::string& text) {
  std::unique_lock lock(mu_);
  if (finish_requested_ || reactor_ == nullptr) return;
  unsent_ += (int64_t)ids.size();
  if (queue_.empty() || !queue_.back().has_delta()) queue_.emplace_back().mutable_delta();
  pdq::v1::TokenDelta* d = queue_.back().mutable_delta();
  for (int32_t id : ids) d->add_token_ids(id);
  d->mutable_text()->append(text);
  Pump(lock);
}

void ResponseStream::Send(pdq::v1::GenerateResponse message) {
  std::unique_lock lock(mu_);
  if (finish_requested_ || reactor_ == nullptr) return;
  if (message.has_delta()) unsent_ += message.delta().token_ids_size();
  queue_.push_back(std::move(message));
  Pump(lock);
}

void ResponseStream::Finish(const grpc::Status& status) {
  std::unique_lock lock(mu_);
  if (finish_requested_) return;
  finish_requested_ = true;
  final_ = status;
  if (!status.ok()) queue_.clear();
  Pump(lock);
}

void ResponseStream::Pump(std::unique_lock<std::mutex>& lock) {
  // gRPC may run a reaction inline from StartWrite or Finish, so both are
  // called with the lock released; the reactor cannot be done before our
  // Finish, so it stays valid.
  Impl* r = reactor_;
  if (r == nullptr || writing_ || finished_) return;
  if (!queue_.empty() && !cancelled_) {
    const pdq::v1::GenerateResponse& next = queue_.front();
    in_flight_tokens_ = next.has_delta() ? next.delta().token_ids_size() : 0;
    in_flight_ = ToByteBuffer(next);
    queue_.pop_front();
    writing_ = true;
    lock.unlock();
    r->StartWrite(&in_flight_);
    return;
  }
  if (finish_requested_) {  // after a cancel too: the producer decides the status
    finished_ = true;
    const grpc::Status status = final_;
    lock.unlock();
    r->Finish(status);
  }
}

}  // namespace pdq::server
