"""Real data sets for training and federated runs, and the partitions that split them over clients.

``load_dataset("fsdd")`` returns the spoken-digit features shipped with mgfl; other specs read data
that the user points at or that an installed package ships. See docs/data.md."""

from mgfl.data.dataset import Dataset
from mgfl.data.errors import DatasetNotInstalledError
from mgfl.data.partition import SCHEMES, partition
from mgfl.data.registry import SPECS, load_dataset

__all__ = ["SCHEMES", "SPECS", "Dataset", "DatasetNotInstalledError", "load_dataset", "partition"]
