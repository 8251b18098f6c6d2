"""Data preparation: a DataFrame checked and written to the Store as Parquet,
and what the training needs to know about that Parquet.

The columns an estimator trains on must be numbers or booleans, arrays of
numbers (every row of the same length) or Spark ML vectors (written as arrays
of doubles).  Any other column, a missing one, nulls, or arrays of different
lengths are a ValueError that names the column and its role, raised on the
driver before any rank starts.  The model's inputs and outputs are checked
against the columns in :func:`check_model_shapes`.
"""

from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

VALIDATION_COL = "__tfhvd_validation"

# A column's spec: {"kind": "scalar" | "array", "dtype": numpy dtype name, "size": int}
ColumnSpec = Dict[str, Any]


def _roles(feature_cols: Sequence[str], label_cols: Sequence[str],
           sample_weight_col: Optional[str]) -> List[Tuple[str, str]]:
    roles = [(c, "feature_cols") for c in feature_cols] + [(c, "label_cols") for c in label_cols]
    if sample_weight_col:
        roles.append((sample_weight_col, "sample_weight_col"))
    return roles


def check_columns(df: Any, feature_cols: Sequence[str], label_cols: Sequence[str],
                  sample_weight_col: Optional[str] = None,
                  validation: Any = None) -> Dict[str, str]:
    """Checks that the columns exist and have a type the estimator can train on;
    returns each column's kind (``scalar``, ``array`` or ``vector``)."""
    from pyspark.ml.linalg import VectorUDT
    from pyspark.sql import types as T

    if not feature_cols:
        raise ValueError("feature_cols is required: the columns fed to the model's inputs")
    if not label_cols:
        raise ValueError("label_cols is required: the label columns, one per model output")
    fields = {f.name: f.dataType for f in df.schema.fields}
    names = ", ".join(fields)
    if isinstance(validation, str) and validation not in fields:
        raise ValueError("validation: column %r is not in the DataFrame (its columns: %s)"
                         % (validation, names))
    kinds = {}
    for col, role in _roles(feature_cols, label_cols, sample_weight_col):
        if col not in fields:
            raise ValueError("%s: column %r is not in the DataFrame (its columns: %s)"
                             % (role, col, names))
        dtype = fields[col]
        if isinstance(dtype, (T.NumericType, T.BooleanType)) and \
                not isinstance(dtype, T.DecimalType):
            kinds[col] = "scalar"
        elif isinstance(dtype, T.ArrayType) and isinstance(
                dtype.elementType, (T.NumericType, T.BooleanType)) and \
                not isinstance(dtype.elementType, T.DecimalType):
            kinds[col] = "array"
        elif isinstance(dtype, VectorUDT):
            kinds[col] = "vector"
        else:
            raise ValueError("%s: column %r has type %s; the estimator trains on numbers, "
                             "booleans, arrays of numbers and ML vectors"
                             % (role, col, dtype.simpleString()))
        if role == "sample_weight_col" and kinds[col] != "scalar":
            raise ValueError("sample_weight_col: column %r must hold one number per row, not %s"
                             % (col, dtype.simpleString()))
    return kinds


def _check_rows(df: Any, kinds: Dict[str, str], roles: Dict[str, str]) -> None:
    """One Spark job: no nulls, and every array column of one length."""
    from pyspark.sql import functions as F

    aggs = []
    for col, kind in kinds.items():
        aggs.append(F.sum(F.col(col).isNull().cast("long")).alias("null:" + col))
        if kind == "array":
            aggs.append(F.min(F.size(col)).alias("min:" + col))
            aggs.append(F.max(F.size(col)).alias("max:" + col))
    row = df.agg(*aggs).collect()[0].asDict()
    for col, kind in kinds.items():
        if row["null:" + col]:
            raise ValueError("%s: column %r has %d null rows; fill or drop them first"
                             % (roles[col], col, row["null:" + col]))
        if kind == "array" and row["min:" + col] != row["max:" + col]:
            raise ValueError("%s: column %r holds arrays of different lengths (%s to %s "
                             "values); every row must have the same shape"
                             % (roles[col], col, row["min:" + col], row["max:" + col]))


def prepare_data(store: Any, df: Any, feature_cols: Sequence[str], label_cols: Sequence[str],
                 validation: Any = None, sample_weight_col: Optional[str] = None,
                 num_partitions: int = 1, seed: Optional[int] = None,
                 dataset_idx: Optional[Any] = None) -> None:
    """Checks ``df``'s columns and writes them as Parquet to the store's train
    (and, with ``validation``, val) paths for ``dataset_idx``, in
    ``num_partitions`` files each.  ML vectors become arrays of doubles."""
    from pyspark.ml.functions import vector_to_array
    from pyspark.sql import functions as F

    kinds = check_columns(df, feature_cols, label_cols, sample_weight_col, validation)
    roles = dict((c, r) for c, r in _roles(feature_cols, label_cols, sample_weight_col))
    cols = list(dict.fromkeys(c for c, _ in _roles(feature_cols, label_cols, sample_weight_col)))
    selected = [vector_to_array(F.col(c)).alias(c) if kinds[c] == "vector" else F.col(c)
                for c in cols]
    if isinstance(validation, float) or (isinstance(validation, int)
                                         and not isinstance(validation, bool)):
        if not 0.0 <= float(validation) < 1.0:
            raise ValueError("validation: a fraction must be in [0, 1), got %r" % (validation,))
        flag = F.rand(seed) < float(validation) if validation else F.lit(False)
    elif isinstance(validation, str):
        flag = F.col(validation).cast("boolean")
    elif validation is None:
        flag = F.lit(False)
    else:
        raise ValueError("validation must be a fraction (float) or a column name, got %r"
                         % (validation,))
    data = df.select(*selected, flag.alias(VALIDATION_COL))
    _check_rows(data, {c: ("array" if k == "vector" else k) for c, k in kinds.items()}, roles)
    paths = [(store.get_train_data_path(dataset_idx), ~F.col(VALIDATION_COL))]
    paths.append((store.get_val_data_path(dataset_idx), F.col(VALIDATION_COL)))
    for path, keep in paths:
        part = data.filter(keep).drop(VALIDATION_COL)
        part.repartition(max(1, num_partitions)).write.mode("overwrite").parquet(
            store.get_full_path(path))


def parquet_metadata(store: Any, path: str) -> Tuple[int, Dict[str, ColumnSpec]]:
    """The row count and column specs of the Parquet dataset at ``path`` (0 and
    {} when there is none), from the files' footers and the first row group."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = store.list_parquet_files(path)
    if not files:
        return 0, {}
    rows, specs = 0, {}
    for name in files:
        with store.fs.open(name, "rb") as f:
            meta = pq.ParquetFile(f).metadata
            rows += meta.num_rows
    for name in files:
        with store.fs.open(name, "rb") as f:
            pf = pq.ParquetFile(f)
            if pf.metadata.num_rows == 0:
                continue
            table = pf.read_row_group(0)
            for field in table.schema:
                if pa.types.is_list(field.type) or pa.types.is_large_list(field.type):
                    first = table.column(field.name).chunk(0)
                    size = len(first.value_lengths()) and int(first.value_lengths()[0].as_py())
                    value_type = field.type.value_type.to_pandas_dtype()
                    specs[field.name] = {"kind": "array", "size": size,
                                         "dtype": np.dtype(value_type).name}
                else:
                    specs[field.name] = {"kind": "scalar", "size": 1,
                                         "dtype": np.dtype(field.type.to_pandas_dtype()).name}
        break
    return rows, specs


def _fmt(shape: Sequence[Optional[int]]) -> str:
    return "(%s)" % ", ".join("None" if d is None else str(d) for d in shape)


def check_model_shapes(specs: Dict[str, ColumnSpec], feature_cols: Sequence[str],
                       label_cols: Sequence[str], input_shapes: List[Any],
                       output_shapes: List[Any],
                       label_shapes: Optional[Sequence[Sequence[int]]] = None) -> None:
    """Checks the columns against the model: one feature column per input and
    one label column per output, each with as many values per row as the
    input (or ``label_shapes``) holds.  A mismatch names the column."""
    if len(feature_cols) != len(input_shapes):
        raise ValueError("feature_cols has %d columns %s but the model has %d inputs"
                         % (len(feature_cols), list(feature_cols), len(input_shapes)))
    if len(label_cols) != len(output_shapes):
        raise ValueError("label_cols has %d columns %s but the model has %d outputs"
                         % (len(label_cols), list(label_cols), len(output_shapes)))
    for col, shape in zip(feature_cols, input_shapes):
        if col not in specs or shape is None or any(d is None for d in shape[1:]):
            continue
        dims = list(shape[1:])
        want = int(np.prod(dims)) if dims else 1
        if specs[col]["size"] != want:
            raise ValueError("feature_cols: column %r holds %d values per row but the model's "
                             "input expects shape %s (%d values)"
                             % (col, specs[col]["size"], _fmt(shape), want))
    for i, (col, shape) in enumerate(zip(label_cols, output_shapes)):
        if col not in specs:
            continue
        dims = list(shape[1:]) if shape is not None else [None]
        if not label_shapes and specs[col]["kind"] == "array" and \
                all(d is not None for d in dims):
            want = int(np.prod(dims)) if dims else 1
            if specs[col]["size"] != want:
                raise ValueError("label_cols: column %r holds %d values per row but the "
                                 "model's output has shape %s (%d values)"
                                 % (col, specs[col]["size"], _fmt(shape), want))
        if label_shapes:
            want = int(np.prod(label_shapes[i]))
            if specs[col]["size"] != want:
                raise ValueError("label_cols: column %r holds %d values per row but "
                                 "label_shapes[%d] is %s"
                                 % (col, specs[col]["size"], i, _fmt(label_shapes[i])))


__all__ = ["check_columns", "prepare_data", "parquet_metadata", "check_model_shapes",
           "VALIDATION_COL"]
