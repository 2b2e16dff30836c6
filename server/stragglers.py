"""Over-selection and a round deadline on the server, as FedScale runs them: sample more clients
than a round needs, then aggregate only the first ``needed`` to finish by simulated time (each
reply carries its client's predicted training and uplink seconds, ``mgfl.simulated_phone``) and
none after the deadline. The rest are the round's stragglers: they trained, but a real server
would have closed the round without them, so their updates are dropped.

Sampling stays Flower's: before each round the wrapped strategy's ``fraction_train`` and
``min_train_nodes`` are set so that its own sampler draws ``ceil(needed x (1 + over))`` nodes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from flwr.app import Message

from mgfl.fleet import ClientTime, SimulatedClock, first_to_finish
from mgfl.simulated_phone import PROFILE_KEY, TRAIN_KEY, UPLINK_KEY, profile_name


def needed_nodes(connected: int, fraction: float, minimum: int) -> int:
    """How many replies a round aggregates: Flower's own rule, ``max(int(N x fraction), min)``,
    bounded by the nodes there are."""
    return min(connected, max(int(connected * fraction), minimum))


def selected_nodes(needed: int, over_selection: float, connected: int) -> int:
    """How many nodes a round samples to keep ``needed``: ``ceil(needed x (1 + over))``, bounded
    by the nodes there are."""
    return min(connected, math.ceil(needed * (1.0 + over_selection) - 1e-9))


@dataclass
class FleetRound:
    """What the deadline and over-selection did to one round's replies."""

    kept: list[Message] = field(default_factory=list)  # in time, among the first ``needed``
    stragglers: list[Message] = field(default_factory=list)  # finished too late
    unreadable: list[tuple[Message, str]] = field(default_factory=list)  # no usable timing
    record: dict = field(default_factory=dict)  # for the round's history


class FleetRounds:
    """Over-selection, deadline and the simulated clock of a run."""

    def __init__(self, fraction_train: float, min_train_nodes: int, over_selection: float = 0.0,
                 deadline_s: float = 0.0, start_s: float = 0.0):
        if over_selection < 0 or deadline_s < 0:
            raise ValueError("over-selection and the round deadline must be >= 0")
        self.fraction_train = fraction_train
        self.min_train_nodes = min_train_nodes
        self.over_selection = over_selection
        self.deadline_s = deadline_s
        self.clock = SimulatedClock()
        self.clock.seconds = start_s  # a resumed run continues its clock
        self.needed: dict[int, int] = {}
        self.records: dict[int, dict] = {}

    def select(self, strategy, connected: int, server_round: int) -> int:
        """Sets the Flower strategy's sampling so that it draws the over-selected count this
        round; returns that count."""
        needed = needed_nodes(connected, self.fraction_train, self.min_train_nodes)
        chosen = selected_nodes(needed, self.over_selection, connected)
        self.needed[server_round] = needed
        strategy.fraction_train = chosen / connected if connected else self.fraction_train
        strategy.min_train_nodes = chosen
        return chosen

    def sort_out(self, server_round: int, replies: Iterable[Message]) -> FleetRound:
        """Keeps the first replies to finish within the deadline; the clock advances by the
        round's simulated length. Error replies are not this filter's business: they go to
        ``kept`` untouched, for the strategy to count."""
        result = FleetRound()
        by_node: dict[int, Message] = {}
        times: list[ClientTime] = []
        for reply in replies:
            if reply.has_error():
                result.kept.append(reply)
                continue
            node = int(reply.metadata.src_node_id)
            try:
                times.append(client_time(node, reply))
            except ValueError as err:
                result.unreadable.append((reply, str(err)))
                continue
            by_node[node] = reply
        needed = self.needed.get(server_round, len(times))
        outcome = first_to_finish(times, needed, self.deadline_s)
        result.kept.extend(by_node[node] for node in outcome.kept)
        result.stragglers = [by_node[node] for node in outcome.stragglers]
        record = self.clock.advance(server_round, outcome)
        record["needed"] = needed
        record["clients"] = [
            {"node": t.client, "profile": t.profile, "train_s": t.train_s,
             "uplink_s": t.uplink_s, "kept": t.client in outcome.kept}
            for t in sorted(times, key=lambda t: (t.total_s, t.client))
        ]
        self.records[server_round] = result.record = record
        return result


def client_time(node: int, reply: Message) -> ClientTime:
    """The simulated training and uplink seconds a reply reports; refused if missing or not
    finite and non-negative."""
    records = list(reply.content.metric_records.values())
    if len(records) != 1:
        raise ValueError(f"expected one MetricRecord in the reply, found {len(records)}")
    metrics = records[0]
    values = {}
    for key in (TRAIN_KEY, UPLINK_KEY, PROFILE_KEY):
        if key not in metrics:
            raise ValueError(f"the reply reports no {key}: was the client told the devices?")
        value = metrics[key]
        if isinstance(value, list) or not math.isfinite(value) or value < 0:
            raise ValueError(f"{key} = {value!r} is not a finite non-negative number")
        values[key] = float(value)
    return ClientTime(node, profile_name(values[PROFILE_KEY]), values[TRAIN_KEY],
                      values[UPLINK_KEY])
