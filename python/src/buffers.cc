#include "buffers.h"

#include <fmt/format.h>

namespace elasticrun::python {

DataType type_of_format(const std::string& format, py::ssize_t itemsize) {
  std::string f = format;
  // '@', '=' and '<' are native or little-endian order on the machines we run on.
  if (!f.empty() && (f[0] == '@' || f[0] == '=' || f[0] == '<')) f.erase(0, 1);
  if (f.size() == 1) {
    switch (f[0]) {
      case 'e': return DataType::f16;
      case 'f': return DataType::f32;
      case 'd': return DataType::f64;
      case 'b': return DataType::i8;
      case 'B': return DataType::u8;
      case 'i':
      case 'l':
      case 'q':
        if (itemsize == 4) return DataType::i32;
        if (itemsize == 8) return DataType::i64;
        break;
      default: break;
    }
  }
  throw py::type_error(fmt::format(
      "elasticrun has no element type for buffer format '{}' ({} bytes per item): it reduces float16, "
      "bfloat16 (torch only), float32, float64, int8, uint8, int32 and int64",
      format, itemsize));
}

std::string format_of(DataType t) {
  switch (t) {
    case DataType::f16: return "e";
    case DataType::f32: return "f";
    case DataType::f64: return "d";
    case DataType::i8: return "b";
    case DataType::u8: return "B";
    case DataType::i32: return "i";
    case DataType::i64: return "l";
    case DataType::bf16: break;
  }
  throw py::type_error("bfloat16 has no buffer-protocol format: pass a torch tensor through elasticrun.torch");
}

std::size_t View::row_elements() const {
  std::size_t n = 1;
  for (std::size_t i = 1; i < info.shape.size(); ++i) n *= static_cast<std::size_t>(info.shape[i]);
  return n;
}

View view_of(const py::handle& obj, bool writable, const char* what) {
  if (!PyObject_CheckBuffer(obj.ptr()))
    throw py::type_error(fmt::format("{}: expected a buffer (a numpy array, bytearray, memoryview ...), got {}",
                                     what, std::string(py::str(py::type::handle_of(obj).attr("__name__")))));
  // PyBUF_ANY_CONTIGUOUS would accept Fortran order, whose flat order differs from the
  // logical one: ask for C order, and say what to do when refused.
  int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
  Py_buffer* raw = new Py_buffer;
  if (PyObject_GetBuffer(obj.ptr(), raw, flags) != 0) {
    delete raw;
    PyErr_Clear();
    // Tell read-only apart from non-contiguous.
    Py_buffer probe;
    if (writable && PyObject_GetBuffer(obj.ptr(), &probe, PyBUF_C_CONTIGUOUS) == 0) {
      PyBuffer_Release(&probe);
      throw py::value_error(fmt::format("{}: the output buffer is read-only", what));
    }
    PyErr_Clear();
    throw py::value_error(fmt::format(
        "{}: the buffer is not C-contiguous; pass numpy.ascontiguousarray(x) (and copy the result back "
        "for an in-place operation)",
        what));
  }
  View v{py::buffer_info(raw, true)};
  v.type = type_of_format(v.info.format, v.info.itemsize);
  if (v.info.itemsize != static_cast<py::ssize_t>(size_of(v.type)))
    throw py::type_error(fmt::format("{}: items of {} bytes for format '{}'", what, v.info.itemsize, v.info.format));
  v.count = static_cast<std::size_t>(v.info.size);
  return v;
}

}  // namespace elasticrun::python
