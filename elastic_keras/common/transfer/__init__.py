"""The wire transfer of tensors between roles.

`tensor_codec` turns a tensor into raw little-endian bytes plus dtype and shape (and row ids
for a sparse one); `transfer_dtype` may narrow float32 gradients to float16 or bfloat16 for
the trip; `compression` picks the codec (snappy, lz4, none); `chunking` splits a payload into
checksummed chunks, each compressed on its own, framed for gRPC; `joining` checks the chunks
and reassembles the tensors; `tensor_stream` is what the PS client and servicer call: it
streams a push or a pull as chunks over gRPC and reads it back, and its `TransferOptions`
(`--compression`, `--chunk-bytes`, `--transfer-dtype`) say how one side sends.
"""
