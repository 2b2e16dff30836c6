"""What the server and the clients of a federated class-incremental run agree on: the tasks (the
classes each brings, in order), when each client meets them, and the local training settings.

Clients meet the tasks in the same order but not at the same round: client ``k`` starts task
``t`` at round ``1 + offset_k + t * rounds_per_task`` with ``offset_k = k mod (stagger + 1)``,
so a task's classes reach the federation over ``stagger + 1`` rounds."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

CLIENT_STATE_EXEMPLARS = "fcl-exemplars"  # ArrayRecord in the client's Context.state only
CLIENT_STATE_META = "fcl-client"
GLOBAL_KEY = "fcl-global"
ROUND_KEY = "fcl-round"
CONFIG_KEY = "fcl-config"
REPLY_KEY = "fcl-reply"
METRICS_KEY = "fcl-metrics"


@dataclass(frozen=True)
class FederatedIncrementalConfig:
    dataset: str = "fsdd"
    model: str = "mlp"
    num_clients: int = 4
    tasks: int = 5
    classes_per_task: int = 2
    rounds_per_task: int = 3
    stagger: int = 1
    memory: int = 100  # exemplars per client
    exemplar_dtype: str = "int8"
    selection: str = "nme"
    epochs: int = 2  # local epochs per round
    batch: int = 32
    lr: float = 0.001
    partition_seed: int = 0
    seed: int = 0
    eval_batch: int = 100
    device: str = ""  # OpenCL device of clients and server evaluation; "" = the default
    output: str = ""  # JSON file the server writes the run's results to

    def __post_init__(self) -> None:
        if min(self.num_clients, self.tasks, self.classes_per_task, self.rounds_per_task) < 1:
            raise ValueError("clients, tasks, classes per task and rounds per task must be >= 1")
        if self.stagger < 0 or self.stagger >= self.rounds_per_task:
            raise ValueError("stagger must lie in [0, rounds-per-task)")

    @property
    def num_rounds(self) -> int:
        """Every client gets ``rounds_per_task`` rounds on its last task."""
        return self.tasks * self.rounds_per_task + self.stagger

    def task_labels(self) -> list[list[int]]:
        k = self.classes_per_task
        return [list(range(t * k, (t + 1) * k)) for t in range(self.tasks)]

    def task_of(self, client: int, server_round: int) -> int:
        """The task client ``client`` trains on at ``server_round`` (rounds count from 1)."""
        offset = client % (self.stagger + 1)
        return min(self.tasks - 1, max(0, server_round - 1 - offset) // self.rounds_per_task)

    def to_mapping(self) -> dict[str, int | float | str]:
        return {name.replace("_", "-"): value for name, value in asdict(self).items()}

    @classmethod
    def from_mapping(cls, values) -> FederatedIncrementalConfig:
        known = {f.name.replace("_", "-"): f.name for f in fields(cls)}
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise ValueError(f"unknown key(s) {', '.join(unknown)}; known: {', '.join(known)}")
        types = {f.name: type(getattr(cls(), f.name)) for f in fields(cls)}
        return cls(**{known[k]: types[known[k]](v) for k, v in values.items()})
