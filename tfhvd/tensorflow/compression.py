"""Gradient compression applied around allreduce (Horovod's ``hvd.Compression``)."""

from typing import Any, Tuple

import tensorflow as tf


class Compressor:
    """Interface: ``compress`` before the collective, ``decompress`` after."""

    @staticmethod
    def compress(tensor: tf.Tensor) -> Tuple[tf.Tensor, Any]:
        raise NotImplementedError

    @staticmethod
    def decompress(tensor: tf.Tensor, ctx: Any) -> tf.Tensor:
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Sends tensors as they are."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class _CastCompressor(Compressor):
    """Casts 32/64-bit floats to a 16-bit float for the wire and back after."""

    wire_dtype = tf.float16

    @classmethod
    def compress(cls, tensor):
        if tensor.dtype.is_floating and tensor.dtype != cls.wire_dtype:
            return tf.cast(tensor, cls.wire_dtype), tensor.dtype
        return tensor, None

    @classmethod
    def decompress(cls, tensor, ctx):
        return tf.cast(tensor, ctx) if ctx is not None else tensor


class FP16Compressor(_CastCompressor):
    """float16 on the wire: half the bytes, but values above 65504 overflow."""

    wire_dtype = tf.float16


class BF16Compressor(_CastCompressor):
    """bfloat16 on the wire: half the bytes and float32's range (fewer mantissa bits)."""

    wire_dtype = tf.bfloat16


class Compression:
    """The available compressors: ``Compression.none``, ``.fp16`` and ``.bf16``."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
