#include "c10d/work.h"

#include <ATen/core/ivalue.h>
#include <ATen/core/jit_type.h>

#include <cstdio>

namespace elasticrun::python::c10d {

Work::Work(int rank, ::c10d::OpType type, const char* title, std::vector<at::Tensor> result,
           std::vector<at::Tensor> keep)
    : ::c10d::Work(rank, type, title),
      result_(std::move(result)),
      keep_(std::move(keep)),
      future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {}

bool Work::isCompleted() { return future_->completed(); }

bool Work::isSuccess() const { return future_->completed() && !future_->hasError(); }

std::exception_ptr Work::exception() const { return future_->completed() ? future_->exception_ptr() : nullptr; }

std::vector<at::Tensor> Work::result() { return result_; }

c10::intrusive_ptr<c10::ivalue::Future> Work::getFuture() { return future_; }

void Work::complete(std::exception_ptr error) {
  try {
    if (error) future_->setError(error);
    else future_->markCompleted(c10::IValue(result_));
  } catch (const std::exception& e) {
    // A callback added with addCallback threw (then() callbacks cannot: their errors go
    // to the future then() made). Nobody waits for it here; the work still completes.
    std::fprintf(stderr, "elasticrun: a callback of a process group's future raised: %s\n", e.what());
  }
  keep_.clear();
  finish(error);
}

}  // namespace elasticrun::python::c10d
