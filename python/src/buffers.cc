#include "buffers.h"

#include <fmt/format.h>

#include <cstdint>

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
  throw py::type_error("bfloat16 has no numpy type for a new result: pass out= (a bfloat16 tensor) or use "
                       "elasticrun.torch");
}

// DLPack's C ABI (dlpack.h, version 0.x as torch 1.13 and numpy 1.24 export it).
struct DLDevice {
  std::int32_t device_type;  // 1: CPU, 3: CUDA host (pinned)
  std::int32_t device_id;
};
struct DLDataType {
  std::uint8_t code;  // 0 int, 1 uint, 2 float, 4 bfloat, 5 complex, 6 bool
  std::uint8_t bits;
  std::uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  std::int32_t ndim;
  DLDataType dtype;
  std::int64_t* shape;
  std::int64_t* strides;  // null: compact row-major
  std::uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor*);
};

namespace {

DataType type_of_dlpack(const DLDataType& t, const char* what) {
  if (t.lanes == 1) {
    if (t.code == 2 && t.bits == 16) return DataType::f16;
    if (t.code == 2 && t.bits == 32) return DataType::f32;
    if (t.code == 2 && t.bits == 64) return DataType::f64;
    if (t.code == 4 && t.bits == 16) return DataType::bf16;
    if (t.code == 0 && t.bits == 8) return DataType::i8;
    if (t.code == 1 && t.bits == 8) return DataType::u8;
    if (t.code == 0 && t.bits == 32) return DataType::i32;
    if (t.code == 0 && t.bits == 64) return DataType::i64;
  }
  throw py::type_error(fmt::format(
      "{}: elasticrun has no element type for DLPack type code {} of {} bits ({} lanes): it reduces float16, "
      "bfloat16, float32, float64, int8, uint8, int32 and int64",
      what, t.code, t.bits, t.lanes));
}

View dlpack_view(const py::handle& obj, const char* what) {
  py::object capsule;
  try {
    capsule = obj.attr("__dlpack__")();
  } catch (py::error_already_set& e) {
    // The exporter's refusal (torch 1.13 has no DLPack code for bool) is a type error here.
    throw py::type_error(fmt::format("{}: no element type the exporter can hand over through DLPack: {}", what,
                                     e.what()));
  }
  auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor"));
  if (m == nullptr) throw py::error_already_set();
  // Consumed: from here the deleter is ours to call (the capsule's own destructor skips a
  // renamed capsule).
  PyCapsule_SetName(capsule.ptr(), "used_dltensor");
  View v;
  v.dlpack = m;
  const DLTensor& t = m->dl_tensor;
  if (t.device.device_type != 1 && t.device.device_type != 3)
    throw py::type_error(fmt::format("{}: the tensor is in device memory (DLPack device type {}); the Python "
                                     "package reduces host memory",
                                     what, t.device.device_type));
  v.type = type_of_dlpack(t.dtype, what);
  v.ptr = static_cast<char*>(t.data) + t.byte_offset;
  v.count = 1;
  for (int i = 0; i < t.ndim; ++i) {
    v.dims.push_back(static_cast<py::ssize_t>(t.shape[i]));
    v.count *= static_cast<std::size_t>(t.shape[i]);
  }
  if (t.strides != nullptr && v.count > 1) {
    std::int64_t expect = 1;
    for (int i = t.ndim - 1; i >= 0; --i) {
      if (t.shape[i] != 1 && t.strides[i] != expect)
        throw py::value_error(fmt::format("{}: the tensor is not contiguous; pass tensor.contiguous() (and copy the "
                                          "result back for an in-place operation)",
                                          what));
      expect *= t.shape[i];
    }
  }
  return v;
}

}  // namespace

View::View(View&& o) noexcept
    : ptr(o.ptr), type(o.type), count(o.count), dims(std::move(o.dims)), buffer(std::move(o.buffer)),
      dlpack(o.dlpack) {
  o.dlpack = nullptr;
}

View::~View() {
  if (dlpack != nullptr && dlpack->deleter != nullptr) dlpack->deleter(dlpack);
}

std::size_t View::row_elements() const {
  std::size_t n = 1;
  for (std::size_t i = 1; i < dims.size(); ++i) n *= static_cast<std::size_t>(dims[i]);
  return n;
}

View view_of(const py::handle& obj, bool writable, const char* what) {
  if (!PyObject_CheckBuffer(obj.ptr()) && py::hasattr(obj, "__dlpack__")) return dlpack_view(obj, what);
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
  View v;
  v.buffer = std::make_unique<py::buffer_info>(raw, true);
  const py::buffer_info& info = *v.buffer;
  v.type = type_of_format(info.format, info.itemsize);
  if (info.itemsize != static_cast<py::ssize_t>(size_of(v.type)))
    throw py::type_error(fmt::format("{}: items of {} bytes for format '{}'", what, info.itemsize, info.format));
  v.ptr = info.ptr;
  v.count = static_cast<std::size_t>(info.size);
  v.dims = info.shape;
  return v;
}

}  // namespace elasticrun::python
