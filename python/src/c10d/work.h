// A collective of the elasticrun process group, as torch sees it: wait(), isCompleted(),
// result(), and a future (DDP's reducer and its communication hooks use the future).
//
// complete() runs on a Completer thread once the engine ran the collective: it
// completes the future first (running its callbacks there, never on the engine's thread)
// and then the work itself, so that whoever wait()ed can read future.value() at once.
// isCompleted(), isSuccess() and exception() follow the future, so that they agree with
// it from the moment it completes.
// An error of the collective (a peer died: WorkersFailed; membership changed:
// HostsUpdated; a deadline passed: TimeoutError) becomes the future's error and is
// rethrown by wait(), with its type: in Python, elasticrun's exception classes.
#pragma once

#include <torch/csrc/distributed/c10d/Work.hpp>

#include <exception>
#include <vector>

namespace elasticrun::python::c10d {

class Work : public ::c10d::Work {
 public:
  // `result`: the tensors the collective writes (the future's value); `keep`: other
  // tensors it reads, kept alive until it is done.
  Work(int rank, ::c10d::OpType type, const char* title, std::vector<at::Tensor> result,
       std::vector<at::Tensor> keep = {});

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  std::vector<at::Tensor> result() override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;

  // The collective ended, with `error` or not.
  void complete(std::exception_ptr error);

 private:
  const std::vector<at::Tensor> result_;
  std::vector<at::Tensor> keep_;
  const c10::intrusive_ptr<c10::ivalue::Future> future_;
};

}  // namespace elasticrun::python::c10d
