"""``TrainingSession``: the driver's side of training one model, whoever drives it.

``TFOptimizer.optimize`` trains epochs, a stream trains micro-batches (a pass
each, in jobs of their own or in a resident job): both go through one
session, which owns what a training call needs besides its settings: the
model, where training stands (:class:`~sparktf.training.driver.run.RunState`),
the model's shared payload, the traced elements of each dataset and the
table strategy. The settings (:class:`~sparktf.training.driver.run.RunSettings`,
the clipping) come with each call, from the client's own attributes.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Optional, Tuple

from sparktf.data.batch_maps import MappedElements
from sparktf.training.checkpoint import ModelState, load_checkpoint, prune_checkpoints, write_checkpoint
from sparktf.training.clipping import GradientClipping
from sparktf.training.driver.run import RunRequest, RunSettings, RunState, TrainingRun, evaluate_model
from sparktf.training.tables.strategy import TableStrategy
from sparktf.training.batch_schedule import SinglePass
from sparktf.triggers import MaxIteration

__all__ = ["TrainingSession"]

#: A micro-batch a state has trained: ``(query id, batchId)``.
StreamMark = Tuple[str, int]


class TrainingSession:
    """The model, its training state, payload, traced elements and tables, on the driver.

    Parameters
    ----------
    model : keras.Model
        The compiled model: it holds the trained state between calls.
    tables : TableStrategy
        How its embedding tables train (replicated or sharded).
    elements : dict
        ``id(dataset)`` -> the dataset's batches as the model gets them (traced once).
    share : callable
        ``share(bytes, name)``: ships bytes to the executors once (``SessionKind.share``).

    Attributes
    ----------
    state : RunState
        Where training stands.
    """

    def __init__(self, model: Any, tables: TableStrategy, elements: Dict[int, MappedElements],
                 share: Callable[[bytes, str], Any]):
        self.model = model
        self.tables = tables
        self.state = RunState()
        self._elements = elements
        self._share = share
        self._payload: Any = None

    def elements_of(self, dataset: Any) -> MappedElements:
        """How the model gets ``dataset``'s batches: traced once for the datasets the session was made with."""
        return self._elements.get(id(dataset)) or MappedElements.of(dataset, self.model)

    def payload(self) -> Any:
        """The model's architecture and compile config, no weights (a few KB), shipped once per session.

        Its key does not depend on the weights: a later session on the same architecture finds the cached step.
        """
        if self._payload is None:
            from sparktf.models.payload import ModelPayload

            payload = ModelPayload.from_model(self.model, include_weights=False).to_bytes()
            self._payload = self._share(payload, "model")
        return self._payload

    def capture(self) -> ModelState:
        """The model's state as training stands (weights, optimizer state, the stream's mark)."""
        captured = self.tables.capture(self.model, self.state.iteration, self.state.optimizer_state_folder)
        captured.stream, captured.publish_due = self.state.stream, self.state.publish_due
        return captured

    def restore(self, path: str) -> None:
        """Take the checkpoint file ``path``: weights, optimizer state, iteration and the stream's mark."""
        loaded = load_checkpoint(path)
        self.state = RunState(iteration=loaded.iteration, optimizer_state_folder=self.tables.load(loaded, self.model),
                              stream=loaded.stream, publish_due=loaded.publish_due)

    def run(self, dataset: Any, settings: RunSettings, clipping: GradientClipping, request: RunRequest,
            summaries: Tuple[Any, Any] = (None, None),
            elements: Optional[MappedElements] = None) -> Tuple[Dict[str, Any], Any]:
        """Train ``dataset`` as ``request`` says (see :class:`TrainingRun`); ``optimize``'s result and History."""
        elements_of = self.elements_of if elements is None else (lambda _: elements)
        return TrainingRun(self.model, dataset, settings, self.state, clipping, self.payload, elements_of,
                           summaries).run(request)

    def evaluate(self, dataset: Any, batch: int, timeout: float, profile: Any, blocks: Any = None,
                 elements: Optional[MappedElements] = None) -> Dict[str, float]:
        """The compiled loss and metrics over ``dataset`` (its ``blocks``, default its own) with the model as it
        stands (see :func:`evaluate_model`)."""
        return evaluate_model(self.model, dataset, elements or self.elements_of(dataset), batch, self.payload(),
                              self.state.iteration, timeout, profile, blocks, self.tables.plan)

    def train_pass(self, dataset: Any, settings: RunSettings, clipping: GradientClipping, mark: StreamMark,
                   elements: MappedElements, publish_due: int = 0) -> List[float]:
        """One pass over ``dataset``'s records (a micro-batch laid out ``one_pass``), its checkpoint recording
        ``mark`` and ``publish_due`` (the micro-batches since the last version, this one included); the
        per-iteration losses.

        A pass that fails leaves the model and the state as they were before it: a checkpoint that could not be
        written does not leave its micro-batch in the model, so a restart in this process trains it once.
        """
        state = self.state
        first = state.iteration
        end = MaxIteration(first + math.ceil(dataset.num_records / dataset.batch_size))
        request = RunRequest(end, end, end, [], 0, None, 1, SinglePass(first))
        before = self.capture()
        kept = (state.iteration, state.last_loss, state.optimizer_state_folder, state.stream, state.publish_due)
        state.stream, state.metric_state, state.publish_due = mark, None, publish_due
        try:
            history, _ = self.run(dataset, settings, clipping, request, elements=elements)
        except BaseException:
            before.apply_to(self.model)
            state.iteration, state.last_loss, state.optimizer_state_folder, state.stream, state.publish_due = kept
            raise
        return list(history["loss"])

    def take_pass(self, trained: ModelState, mark: StreamMark, last_loss: Optional[float], model_dir: str,
                  keep: Optional[int], publish_due: int = 0) -> None:
        """A pass trained elsewhere (a resident job's): its checkpoint, recording ``mark`` and ``publish_due``, is
        written first, then the model and the state take it (a write that fails leaves them as they were)."""
        trained.stream, trained.publish_due = mark, publish_due
        write_checkpoint(trained, model_dir)
        prune_checkpoints(model_dir, keep)
        trained.apply_to(self.model)
        state = self.state
        state.iteration, state.stream, state.publish_due = trained.iteration, mark, publish_due
        state.metric_state = None
        state.last_loss = state.last_loss if last_loss is None else last_loss
