"""How a table's ids reach it in the model's graph, and what else reads them.

A sharded table is looked up by a model input of integer ids, or by one
column of one (``ids[:, i]``, a ``GetItem`` on a 2-D input: a DLRM's
categorical features in one array). Before a step, a rank replaces those ids
in the batch by their positions among the batch's unique ids (the rows of
its working table), so nothing else may read them: every other reader must
be a sharded table looked up by the same ids (which then has the same
positions), or, for a column, a ``GetItem`` of another column.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Set, Tuple

import numpy as np

from sparktf.models.keras_internals import call_nodes, column_of

__all__ = ["Lookup", "lookup_of", "other_readers"]


@dataclass(frozen=True)
class Lookup:
    """Where a table's ids come from.

    Attributes
    ----------
    input_name : str
        The model input of ids.
    column : int, optional
        The column of that 2-D input the table is looked up by; None: the whole input.
    ids_per_record : int
        Ids one record gives the table.
    """

    input_name: str
    column: Optional[int]
    ids_per_record: int


def input_names(model: Any) -> List[str]:
    """Each model input's name as its ``InputLayer`` has it: the name it keeps when the model is rebuilt from its
    config (an unnamed input's tensor is ``keras_tensor_N`` only in the model it was made in)."""
    import keras

    layers = {id(layer.output): layer.name for layer in getattr(model, "layers", ())
              if isinstance(layer, keras.layers.InputLayer)}
    return [layers.get(id(tensor), tensor.name) for tensor in getattr(model, "inputs", None) or ()]


def lookup_of(model: Any, layer: Any, strings: bool = False) -> Tuple[Optional[Lookup], Optional[str]]:
    """``(lookup, None)`` when ``layer`` is called once, on a model input of integer ids (or, with ``strings``,
    string ids) or on one column of one; ``(None, reason)`` otherwise."""
    nodes = call_nodes(layer)
    if len(nodes) != 1:
        return None, f"it is called {len(nodes)} times (a sharded table is looked up by one model input)"
    tensors = list(nodes[0].input_tensors)
    if len(tensors) != 1:
        return None, "it is called on several tensors"
    inputs = {id(tensor): tensor for tensor in getattr(model, "inputs", None) or ()}
    name_of = dict(zip(inputs, input_names(model)))
    tensor = tensors[0]
    source, column = (tensor, None) if id(tensor) in inputs else _input_column(tensor, inputs)
    if source is None:
        return None, "its ids are not a model input or a column of one (they are computed inside the model)"
    if not np.issubdtype(np.dtype(source.dtype), np.integer) and not (strings and source.dtype == "string"):
        return None, f"its model input {name_of[id(source)]!r} is {source.dtype}, not integer ids"
    return Lookup(name_of[id(source)], column, int(np.prod([d or 1 for d in tensor.shape[1:]], dtype=np.int64))), None


def other_readers(model: Any, lookups: Dict[str, Lookup]) -> Dict[str, str]:
    """For each table of ``lookups`` (by layer name) whose ids something else reads: the name of that reader.

    A model input read whole by tables may be read only by those tables; one whose columns tables read, only by
    ``GetItem`` columns; such a column, only by the tables looked up by it.
    """
    inputs = {id(tensor): tensor for tensor in getattr(model, "inputs", None) or ()}
    name_of = dict(zip(inputs, input_names(model)))
    tables_of: Dict[Tuple[str, Optional[int]], Set[str]] = {}
    for name, lookup in lookups.items():
        tables_of.setdefault((lookup.input_name, lookup.column), set()).add(name)
    on_input: Dict[str, Set[str]] = {}
    for (input_name, _), names in tables_of.items():
        on_input.setdefault(input_name, set()).update(names)
    conflicts: Dict[str, str] = {}
    for operation in getattr(model, "operations", ()):
        for node in call_nodes(operation):
            for tensor in node.input_tensors:
                if id(tensor) in inputs and name_of[id(tensor)] in on_input:  # the input itself
                    whole = tables_of.get((name_of[id(tensor)], None))
                    if whole is not None:
                        fine = operation.name in whole
                    else:  # read by columns: only columns of it may be taken
                        outputs = list(getattr(node, "output_tensors", ()) or ())
                        fine = bool(outputs) and _input_column(outputs[0], inputs)[0] is not None
                    affected = on_input[name_of[id(tensor)]]
                else:
                    source, column = _input_column(tensor, inputs)
                    if source is None or (name_of[id(source)], column) not in tables_of:
                        continue
                    affected = tables_of[(name_of[id(source)], column)]
                    fine = operation.name in affected
                if not fine:
                    for name in affected:
                        conflicts.setdefault(name, operation.name)
    return conflicts


def _input_column(tensor: Any, inputs: Dict[int, Any]) -> Tuple[Any, Optional[int]]:
    """``(model input, column)`` when ``tensor`` is ``input[:, column]`` of a 2-D model input; ``(None, None)``
    otherwise."""
    found = column_of(tensor)
    if found is None:
        return None, None
    source, key = found
    if id(source) not in inputs or len(source.shape) != 2:
        return None, None
    if not (isinstance(key, tuple) and len(key) == 2 and key[0] == slice(None)
            and isinstance(key[1], (int, np.integer)) and not isinstance(key[1], bool)):
        return None, None
    width = source.shape[1]
    column = int(key[1])
    if width is None or not -width <= column < width:
        return None, None
    return source, column % width
