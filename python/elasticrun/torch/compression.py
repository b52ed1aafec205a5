"""Gradient compression for the wire, with Horovod's interface: a compressor turns a
tensor into the one that is sent (and a context) and back again."""
import torch

__all__ = ["Compressor", "NoneCompressor", "FP16Compressor", "Compression"]


class Compressor:
    """Interface: compress(tensor) -> (tensor to send, context); decompress(tensor,
    context) -> tensor in the original form. Static methods, as in Horovod."""

    @staticmethod
    def compress(tensor):
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Sends the tensor as it is (no copy)."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class FP16Compressor(Compressor):
    """Sends floating-point tensors as float16 (half the bytes; the reduction is done in
    float16, so sums of many large values can overflow: scale with prescale_factor or
    gradient_predivide_factor), and converts the result back to the original type.
    Other types are sent as they are."""

    @staticmethod
    def compress(tensor):
        if tensor.dtype.is_floating_point and tensor.dtype != torch.float16:
            return tensor.to(torch.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor if ctx is None else tensor.to(ctx)


class Compression:
    """The built-in compressors: ``Compression.none`` and ``Compression.fp16``."""
    none = NoneCompressor
    fp16 = FP16Compressor
