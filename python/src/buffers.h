// Python buffers as the library's raw buffers: the buffer protocol's format and shape, or
// a DLPack tensor's type and shape (torch tensors, and anything with __dlpack__),
// mapped to a DataType and an element count, with no copy.
#pragma once

#include <elasticrun/types.hpp>

#include <pybind11/pybind11.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace elasticrun::python {

namespace py = pybind11;

struct DLManagedTensor;

// A C-contiguous buffer and what the library needs of it. Holds the exporter's view
// (a buffer_info, or the consumed DLPack tensor, whose deleter it calls) for as long as it
// lives; destroy it with the GIL held.
struct View {
  View() = default;
  View(View&&) noexcept;
  View& operator=(View&&) = delete;
  ~View();

  void* ptr = nullptr;
  DataType type = DataType::u8;
  std::size_t count = 0;  // elements
  std::vector<py::ssize_t> dims;

  void* data() const { return ptr; }
  std::size_t bytes() const { return count * size_of(type); }
  // Elements per index of the first dimension (1 for a scalar or a 1-d buffer).
  std::size_t row_elements() const;
  std::vector<py::ssize_t> shape() const { return dims; }

  std::unique_ptr<py::buffer_info> buffer;
  DLManagedTensor* dlpack = nullptr;
};

// The DataType of a buffer-protocol format ("f", "<d", "e", "l" ...) and item size;
// TypeError for one the library has no type for (bool, complex, unsigned 16/32/64-bit,
// big-endian, structured).
DataType type_of_format(const std::string& format, py::ssize_t itemsize);
// Refuses a non-contiguous buffer with ValueError (a copy would hide that an in-place
// result does not reach the caller's array) and, when `writable`, a read-only one. An
// object without the buffer protocol is taken through DLPack when it has __dlpack__
// (host memory only; DLPack before 1.0 has no read-only flag, so it counts as writable).
View view_of(const py::handle& obj, bool writable, const char* what);
// The buffer-protocol format that numpy uses for a DataType; bf16 has none (TypeError).
std::string format_of(DataType t);

}  // namespace elasticrun::python
