"""Class-incremental learning on the engine (iCaRL with FastICARL's options), and the two
baselines that bound it: fine-tuning on new classes only, and joint training on all data seen.

One increment (task) of the ``icarl`` method:

1. the previous model's logits of every training sample (new-class data + exemplars), from an
   evaluation-mode engine of that model on the device;
2. the head grows by the new classes; the network trains on new data + exemplars with
   cross-entropy plus distillation from those logits (the distillation kernel in the step);
3. exemplars of the new classes are chosen on the new network's features (its penultimate
   activations, from an evaluation-mode engine of the network cut below its head: the features
   come from the same kernels that train it, on the device), and the memory is rebalanced;
4. class means of the exemplars' features are kept for nearest-mean-of-exemplars prediction.

Labels are positions in the order classes arrive: task ``t`` brings the next ``k`` labels.
"""

from __future__ import annotations

import resource
import time
from dataclasses import asdict, dataclass

import numpy as np

from client_runtime.continual.head import feature_model, feature_state, grow_head, with_classes
from client_runtime.continual.memory import ExemplarMemory, MemoryBudget
from client_runtime.continual.selection import l2_normalize, selector
from client_runtime.device import Device
from client_runtime.graph import DistillConfig, OptimizerConfig
from client_runtime.step import CompiledStep
from client_runtime.trainer import batches_per_epoch
from mgfl.models.model import Model

METHODS = ("icarl", "finetune", "joint")
CLASSIFIERS = ("head", "nme")


@dataclass(frozen=True)
class IncrementalConfig:
    method: str = "icarl"
    memory: int = 200  # exemplars in all
    memory_bytes: int | None = None
    exemplar_dtype: str = "float32"
    selection: str = "herding"
    classifier: str = "head"
    epochs: int = 10
    batch: int = 32
    optimizer: str = "adam"
    lr: float = 0.001
    momentum: float = 0.9
    weight_decay: float = 0.0
    temperature: float = 2.0
    distill_weight: float = 1.0
    balanced: bool = True  # draw batches class-balanced, so few exemplars weigh like new data
    eval_batch: int = 100
    seed: int = 0

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"method {self.method!r} unknown; use one of {METHODS}")
        if self.classifier not in CLASSIFIERS:
            raise ValueError(f"classifier {self.classifier!r} unknown; use one of {CLASSIFIERS}")
        if self.classifier == "nme" and self.method != "icarl":
            raise ValueError("nearest-mean-of-exemplars prediction needs the icarl method")
        if self.epochs < 1 or self.batch < 1 or self.eval_batch < 1:
            raise ValueError("epochs, batch and eval_batch must be positive")
        selector(self.selection)

    @property
    def optimizer_config(self) -> OptimizerConfig:
        return OptimizerConfig(
            self.optimizer, lr=self.lr, momentum=self.momentum, weight_decay=self.weight_decay
        )


@dataclass
class IncrementReport:
    """What one increment cost and left behind."""

    task: int
    classes: list[int]
    train_samples: int
    replayed_samples: int
    seconds: float
    train_seconds: float
    old_logits_seconds: float
    selection_seconds: float
    peak_device_bytes: int  # the largest arena of the increment (one is alive at a time)
    peak_host_rss_bytes: int  # of the process, so far
    exemplar_bytes: int
    exemplars: int
    loss: float
    train_accuracy: float

    def to_dict(self) -> dict:
        return asdict(self)


def eval_step(
    device: Device, model: Model, state: dict[str, np.ndarray], batch: int
) -> CompiledStep:
    """An evaluation-only engine (nothing trainable, so no backward is built)."""
    return CompiledStep(device, model, batch, state, trainable=set())


def train_increment(
    device: Device,
    model: Model,
    state: dict[str, np.ndarray],
    x: np.ndarray,
    y: np.ndarray,
    config: IncrementalConfig,
    old_logits: np.ndarray | None,
    c_old: int,
    seed: tuple[int, ...],
) -> tuple[dict[str, np.ndarray], dict, int]:
    """``config.epochs`` epochs on ``(x, y)`` with cross-entropy, plus distillation from
    ``old_logits`` over the first ``c_old`` classes when given; returns the trained state, the
    last epoch's loss and accuracy, and the arena's peak bytes."""
    batch = min(config.batch, len(y))
    distillation = None
    if old_logits is not None:
        distillation = DistillConfig(c_old, config.temperature, config.distill_weight)
    step = CompiledStep(
        device, model, batch, state, optimizer=config.optimizer_config, distillation=distillation
    )
    rng = np.random.default_rng(list(seed))
    per_epoch = batches_per_epoch(len(y), batch)
    weights = None
    if config.balanced:
        counts = np.bincount(y)
        weights = 1.0 / counts[y]
        weights /= weights.sum()
    for _ in range(config.epochs):
        step.read_train_stats(reset=True)
        if weights is None:
            order = rng.permutation(len(y))
        else:  # as many draws as samples, each class equally likely
            order = rng.choice(len(y), size=per_epoch * batch, p=weights)
        for b in range(per_epoch):
            idx = order[b * batch : (b + 1) * batch]
            step.train_step(x[idx], y[idx], None if old_logits is None else old_logits[idx])
    stats = step.read_train_stats()
    return step.get_state(), stats, step.peak_bytes


def choose_exemplars(
    device: Device,
    model: Model,
    state: dict[str, np.ndarray],
    x: np.ndarray,
    y: np.ndarray,
    labels: list[int],
    quota: int,
    config: IncrementalConfig,
) -> tuple[dict[int, np.ndarray], int]:
    """The ordered exemplars of each class in ``labels``, chosen on the features of ``model``
    (cut below its head, run on the device); also the feature engine's peak bytes."""
    step = eval_step(device, feature_model(model), feature_state(model, state), config.eval_batch)
    choose = selector(config.selection)
    chosen = {}
    for label in labels:
        members = x[y == label]
        chosen[label] = members[choose(step.predict(members), quota)]
    return chosen, step.peak_bytes


def _peak_rss_bytes() -> int:
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux: KiB


class IncrementalLearner:
    """A model that learns classes task after task; ``state`` is its current weights."""

    def __init__(
        self,
        device: Device,
        model: Model,
        config: IncrementalConfig,
        state: dict[str, np.ndarray] | None = None,
    ):
        self.device = device
        self.config = config
        self.base_model = model
        # with a state, ``model`` has already learnt its classes (e.g. a federated global model)
        self.model: Model | None = model if state is not None else None
        self.state = state
        self.memory = ExemplarMemory(
            MemoryBudget(config.memory if config.method == "icarl" else 0, config.memory_bytes),
            config.exemplar_dtype,
            model.input_shape,
        )
        self.class_means: np.ndarray | None = None
        self.seen: list[tuple[np.ndarray, np.ndarray]] = []  # joint training only
        self.reports: list[IncrementReport] = []

    @property
    def num_classes(self) -> int:
        return 0 if self.model is None else self.model.num_classes

    # -- one increment ---------------------------------------------------------------------------
    def learn(self, x: np.ndarray, y: np.ndarray) -> IncrementReport:
        """Learn the classes of ``y`` (the next labels in arrival order) from ``x``, keeping
        what the method keeps of the old ones."""
        cfg, start = self.config, time.perf_counter()
        x, y = np.ascontiguousarray(x, np.float32), np.ascontiguousarray(y, np.int32)
        old = self.num_classes
        new_classes = sorted(int(c) for c in np.unique(y))
        if new_classes != list(range(old, old + len(new_classes))):
            raise ValueError(
                f"a task must bring the next labels {old}, {old + 1}, ...; got {new_classes}"
            )
        total = old + len(new_classes)
        old_model, old_state = self.model, self.state
        self._grow(total)
        train_x, train_y, replayed = self._training_set(x, y)
        peak = 0
        t0 = time.perf_counter()
        old_logits = None
        if cfg.method == "icarl" and old_model is not None:
            old_step = self._eval_step(old_model, old_state)
            old_logits = old_step.predict(train_x)
            peak = max(peak, old_step.peak_bytes)
            del old_step
        t1 = time.perf_counter()
        stats, step_peak = self._train(train_x, train_y, old_logits, old)
        peak = max(peak, step_peak)
        t2 = time.perf_counter()
        if cfg.method == "icarl":
            peak = max(peak, self._update_memory(x, y, new_classes))
        t3 = time.perf_counter()
        report = IncrementReport(
            task=len(self.reports),
            classes=new_classes,
            train_samples=len(train_y),
            replayed_samples=replayed,
            seconds=t3 - start,
            train_seconds=t2 - t1,
            old_logits_seconds=t1 - t0,
            selection_seconds=t3 - t2,
            peak_device_bytes=peak,
            peak_host_rss_bytes=_peak_rss_bytes(),
            exemplar_bytes=self.memory.nbytes,
            exemplars=len(self.memory),
            loss=stats["loss"],
            train_accuracy=stats["accuracy"],
        )
        self.reports.append(report)
        return report

    def _grow(self, total: int) -> None:
        if self.model is None:
            self.model = with_classes(self.base_model, total)
            self.state = self.model.init_state(self.config.seed)
        else:
            self.model, self.state = grow_head(self.model, self.state, total, self.config.seed)

    def _training_set(self, x, y) -> tuple[np.ndarray, np.ndarray, int]:
        if self.config.method == "joint":
            self.seen.append((x, y))
            xs, ys = zip(*self.seen, strict=True)
            return np.concatenate(xs), np.concatenate(ys), sum(len(v) for v in ys[:-1])
        mx, my = self.memory.samples()
        return np.concatenate([x, mx]), np.concatenate([y, my]), len(my)

    def _train(self, x, y, old_logits, c_old: int) -> tuple[dict, int]:
        self.state, stats, peak = train_increment(
            self.device, self.model, self.state, x, y, self.config, old_logits, c_old,
            seed=(self.config.seed, len(self.reports)),
        )  # fmt: skip
        return stats, peak

    def _eval_step(self, model: Model, state: dict[str, np.ndarray]) -> CompiledStep:
        return eval_step(self.device, model, state, self.config.eval_batch)

    def _update_memory(self, x, y, new_classes: list[int]) -> int:
        """Choose exemplars of the new classes, rebalance, recompute the class means."""
        quota = self.memory.quota(self.num_classes)
        chosen, _ = choose_exemplars(
            self.device, self.model, self.state, x, y, new_classes, quota, self.config
        )
        self.memory.add_classes(chosen)
        step = self._eval_step(feature_model(self.model), feature_state(self.model, self.state))
        ex_x, ex_y = self.memory.samples()
        means = np.zeros((self.num_classes, step.graph.tensors[step.graph.eval_output].shape[1]))
        if len(ex_y):
            features = l2_normalize(step.predict(ex_x))
            for label in np.unique(ex_y):
                means[label] = features[ex_y == label].mean(axis=0)
        self.class_means = l2_normalize(means)
        return step.peak_bytes

    # -- prediction ------------------------------------------------------------------------------
    def predict(self, x: np.ndarray, classifier: str | None = None) -> np.ndarray:
        """Labels of ``x`` by the network's head or by the nearest mean of exemplars."""
        if self.model is None:
            raise ValueError("nothing learnt yet")
        classifier = classifier or self.config.classifier
        x = np.ascontiguousarray(x, np.float32)
        if classifier == "head":
            return self._eval_step(self.model, self.state).predict(x).argmax(axis=1)
        if classifier != "nme" or self.class_means is None:
            raise ValueError("nearest-mean-of-exemplars prediction needs an exemplar memory")
        step = self._eval_step(feature_model(self.model), feature_state(self.model, self.state))
        features = l2_normalize(step.predict(x))
        distance = ((features[:, None, :] - self.class_means[None]) ** 2).sum(axis=2)
        return distance.argmin(axis=1)

    def accuracy_per_task(
        self, x: np.ndarray, y: np.ndarray, tasks: list[list[int]], classifier: str | None = None
    ) -> list[float]:
        """Accuracy on the test samples of each task in ``tasks`` (lists of labels)."""
        predicted = self.predict(x, classifier)
        out = []
        for labels in tasks:
            mask = np.isin(y, labels)
            out.append(float(np.mean(predicted[mask] == y[mask])) if mask.any() else float("nan"))
        return out
