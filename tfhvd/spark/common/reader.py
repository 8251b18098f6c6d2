"""The one reader of the estimators' data: a rank's shard of a Parquet dataset
in a Store, as a ``tf.data.Dataset``, read with pyarrow.

Sharding: the dataset's row groups, listed file by file in sorted file name
order, go to the ranks in turn (rank ``r`` reads pieces ``r``, ``r + size``,
...).  With fewer row groups than ranks, every rank reads all of them and
keeps rows ``r``, ``r + size``, ...; with fewer rows than ranks, rank ``r``
keeps row ``r % rows`` (so every rank has data).  Rows are read one row group at a time
(streamed, not loaded whole), then shuffled in a buffer, batched and
reshaped to the model's input and output shapes.  Floating columns (Spark's
doubles are float64) are cast to ``keras.backend.floatx()``, as Keras's own
``fit`` casts numpy arrays, so that a loss or metric mixing labels and
predictions sees one dtype; integer and boolean columns keep their type.

Why pyarrow and not Petastorm (Horovod's reader): Petastorm's last release
is from 2023 and pins old pyarrow behaviour; pyarrow is maintained with
Spark's own Parquet support, reads through the Store's fsspec filesystem, and
needs no reader processes, so a tf.data generator over its row groups is all
a rank needs.
"""

from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np


def shard(store: Any, path: str, rank: int,
          size: int) -> Tuple[List[Tuple[str, int]], Optional[Tuple[int, int]]]:
    """The (file, row group) pieces rank ``rank`` reads, and, when there are
    fewer pieces than ranks, the ``(num_shards, index)`` of the rows it keeps.

    Every rank gets rows when the dataset has any: with fewer rows than ranks
    (a validation set of 1 row on 2 ranks, say), rank ``r`` keeps row
    ``r % rows``, so a few rows are read by more than one rank.  A rank without
    rows would run no validation step and its metrics would not match the
    other ranks' when they are averaged.
    """
    import pyarrow.parquet as pq

    pieces, rows = [], 0
    for name in store.list_parquet_files(path):
        with store.fs.open(name, "rb") as f:
            meta = pq.ParquetFile(f).metadata
        for g in range(meta.num_row_groups):
            if meta.row_group(g).num_rows > 0:
                pieces.append((name, g))
                rows += meta.row_group(g).num_rows
    if len(pieces) >= size:
        return pieces[rank::size], None
    shards = max(1, min(size, rows))
    return pieces, (shards, rank % shards)


def _column_array(table: Any, col: str) -> np.ndarray:
    """A Parquet column as numpy: scalars as (n,), lists as (n, length)."""
    import pyarrow as pa

    column = table.column(col).combine_chunks()
    if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
        lengths = column.value_lengths().to_numpy(zero_copy_only=False)
        if len(lengths) and (lengths.min() != lengths.max()):
            raise ValueError("column %r holds arrays of different lengths (%d to %d values); "
                             "every row must have the same shape"
                             % (col, lengths.min(), lengths.max()))
        values = column.flatten().to_numpy(zero_copy_only=False)
        return values.reshape(len(column), -1)
    return column.to_numpy(zero_copy_only=False)


def read_pieces(store: Any, pieces: Sequence[Tuple[str, int]],
                columns: Sequence[str]) -> Iterator[Dict[str, np.ndarray]]:
    """The pieces' rows, one row group at a time, as column -> numpy array."""
    import pyarrow.parquet as pq

    for name, group in pieces:
        with store.fs.open(name, "rb") as f:
            table = pq.ParquetFile(f).read_row_group(group, columns=list(columns))
        yield {c: _column_array(table, c) for c in columns}


def _target_shape(size: int, shape: Optional[Sequence[Optional[int]]]) -> Optional[List[int]]:
    """``shape`` when a row of ``size`` values can be reshaped to it, else None."""
    if shape is None or any(d is None or d < 0 for d in shape):
        return None
    want = int(np.prod(shape)) if len(shape) else 1
    return list(shape) if want == size else None


def make_dataset(store: Any, path: str, rank: int, size: int, feature_cols: Sequence[str],
                 label_cols: Sequence[str], specs: Dict[str, Dict[str, Any]],
                 batch_size: int, input_shapes: Sequence[Sequence[Optional[int]]],
                 output_shapes: Sequence[Sequence[Optional[int]]],
                 label_shapes: Optional[Sequence[Sequence[int]]] = None,
                 sample_weight_col: Optional[str] = None, shuffle_buffer_size: int = 0,
                 seed: Optional[int] = None, cache: bool = False,
                 transformation_fn: Optional[Callable] = None,
                 floatx: Optional[str] = "float32") -> Any:
    """Rank ``rank``'s shard of the Parquet dataset at ``path`` as a repeated
    ``tf.data.Dataset`` of ``(features, labels[, sample_weights])`` batches.

    ``input_shapes``/``output_shapes`` are the model's per-row shapes (no batch
    dimension); a column is reshaped to its input's shape (labels: to
    ``label_shapes``, else to the output's shape) when the sizes agree.
    ``transformation_fn``, if given, maps each row group's dict of numpy
    arrays to a dict with the same columns before batching.  Floating columns
    (features, labels, sample weights) are cast to ``floatx`` (Keras's
    ``keras.backend.floatx()``; None: not cast); integer and boolean columns
    keep their type.
    """
    import tensorflow as tf

    columns = list(dict.fromkeys(list(feature_cols) + list(label_cols)
                                 + ([sample_weight_col] if sample_weight_col else [])))
    pieces, by_row = shard(store, path, rank, size)
    float_type = None if floatx is None else tf.as_dtype(floatx)

    def generate() -> Iterator[Tuple[np.ndarray, ...]]:
        for chunk in read_pieces(store, pieces, columns):
            if transformation_fn is not None:
                chunk = transformation_fn(chunk)
            yield tuple(chunk[c] for c in columns)

    def row_spec(col: str) -> Any:
        spec = specs[col]
        shape = (None,) if spec["kind"] == "scalar" else (None, spec["size"])
        return tf.TensorSpec(shape, tf.as_dtype(np.dtype(spec["dtype"])))

    ds = tf.data.Dataset.from_generator(generate, output_signature=tuple(
        row_spec(c) for c in columns)).unbatch()
    if by_row is not None:
        ds = ds.shard(*by_row)
    if cache:
        ds = ds.cache()
    if shuffle_buffer_size and shuffle_buffer_size > 0:
        ds = ds.shuffle(shuffle_buffer_size, seed=seed, reshuffle_each_iteration=True)
    ds = ds.repeat().batch(batch_size)

    index = {c: i for i, c in enumerate(columns)}
    feat_shapes = [_target_shape(specs[c]["size"], s) for c, s in zip(feature_cols, input_shapes)]
    lab_shapes = []
    for i, (c, s) in enumerate(zip(label_cols, output_shapes)):
        if label_shapes:
            lab_shapes.append(list(label_shapes[i]))
        elif specs[c]["kind"] == "array":
            lab_shapes.append(_target_shape(specs[c]["size"], s))
        else:
            lab_shapes.append(None)

    def shaped(t: Any, shape: Optional[List[int]]) -> Any:
        if float_type is not None and t.dtype.is_floating and t.dtype != float_type:
            t = tf.cast(t, float_type)
        return t if shape is None else tf.reshape(t, [-1] + shape)

    def to_model(*row: Any) -> Any:
        x = [shaped(row[index[c]], s) for c, s in zip(feature_cols, feat_shapes)]
        y = [shaped(row[index[c]], s) for c, s in zip(label_cols, lab_shapes)]
        out = (x[0] if len(x) == 1 else tuple(x), y[0] if len(y) == 1 else tuple(y))
        if sample_weight_col:
            out = out + (shaped(row[index[sample_weight_col]], None),)
        return out

    return ds.map(to_model).prefetch(tf.data.AUTOTUNE)


__all__ = ["shard", "read_pieces", "make_dataset"]
