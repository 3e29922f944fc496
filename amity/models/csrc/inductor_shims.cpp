// C entry points that a compiled graph calls directly (compilation.py). Inductor's
// cpp_wrapper otherwise reaches a custom op through aoti_torch_call_dispatcher: a
// lookup of the op by name, its arguments boxed and unboxed, a new tensor handle per
// argument, on every call, some 150 calls a step. It calls an op it is given a C
// declaration for (config aot_inductor.custom_ops_to_c_shims) by the name
// aoti_torch_<device>_<op>, with tensors as handles (at::Tensor pointers), optional
// ones as pointers to handles (null for None), and the result as a new handle.
// compilation.py declares them for the generated code from the ops' schemas: each
// must take its op's arguments in schema order, typed as above.

#include <torch/extension.h>
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/inductor/aoti_torch/utils.h>

at::Tensor block_linear(const at::Tensor& x, const at::Tensor& weight, int64_t format,
                        const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& tile_rows);
at::Tensor bf16_linear(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                       bool tiles);
at::Tensor packed_linear(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& scale,
                         const std::optional<at::Tensor>& bias);
at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, at::Tensor& k_cache,
                           at::Tensor& v_cache, const at::Tensor& slot_mapping, const at::Tensor& query_start,
                           const at::Tensor& context_lens, const at::Tensor& block_tables, double scale,
                           const std::optional<at::Tensor>& tile_rows);

namespace {
using torch::aot_inductor::new_tensor_handle;

at::Tensor& tensor(AtenTensorHandle handle) { return *torch::aot_inductor::tensor_handle_to_tensor_pointer(handle); }

std::optional<at::Tensor> optional(const AtenTensorHandle* handle) {
  return handle ? std::make_optional(tensor(*handle)) : std::nullopt;
}
}  // namespace

extern "C" {

AOTITorchError aoti_torch_cpu_block_linear(AtenTensorHandle x, AtenTensorHandle weight, int64_t format,
                                           AtenTensorHandle* bias, AtenTensorHandle* tile_rows, AtenTensorHandle* out) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({
    *out = new_tensor_handle(block_linear(tensor(x), tensor(weight), format, optional(bias), optional(tile_rows)));
  });
}

AOTITorchError aoti_torch_cpu_bf16_linear(AtenTensorHandle x, AtenTensorHandle weight, AtenTensorHandle* bias,
                                          int32_t tiles, AtenTensorHandle* out) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({
    *out = new_tensor_handle(bf16_linear(tensor(x), tensor(weight), optional(bias), tiles != 0));
  });
}

AOTITorchError aoti_torch_cpu_packed_linear(AtenTensorHandle x, AtenTensorHandle weight, AtenTensorHandle* scale,
                                            AtenTensorHandle* bias, AtenTensorHandle* out) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({
    *out = new_tensor_handle(packed_linear(tensor(x), tensor(weight), optional(scale), optional(bias)));
  });
}

AOTITorchError aoti_torch_cpu_paged_attention(AtenTensorHandle q, AtenTensorHandle k, AtenTensorHandle v,
                                              AtenTensorHandle k_cache, AtenTensorHandle v_cache,
                                              AtenTensorHandle slot_mapping, AtenTensorHandle query_start,
                                              AtenTensorHandle context_lens, AtenTensorHandle block_tables,
                                              double scale, AtenTensorHandle* tile_rows, AtenTensorHandle* out) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({
    *out = new_tensor_handle(paged_attention(tensor(q), tensor(k), tensor(v), tensor(k_cache), tensor(v_cache),
                                             tensor(slot_mapping), tensor(query_start), tensor(context_lens),
                                             tensor(block_tables), scale, optional(tile_rows)));
  });
}

}  // extern "C"
