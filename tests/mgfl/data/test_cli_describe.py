import json

from typer.testing import CliRunner

from mgfl.cli import app
from tests.mgfl.data.conftest import needs_spafe

runner = CliRunner()


def describe(*args):
    result = runner.invoke(app, ["data", "describe", *args])
    return result


def test_natural_partition_of_the_default_as_json():
    result = describe("--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["data"] == "fsdd" and summary["input_shape"] == [1, 40, 40]
    assert summary["partition"]["scheme"] == "natural"
    clients = summary["clients"]
    assert [c["name"] for c in clients] == summary["groups"]
    assert all(c["samples"] == 450 and c["label_histogram"] == [45] * 10 for c in clients)


def test_dirichlet_counts_add_up():
    result = describe("--data", "synthetic:1,4,4:5", "--partition", "dirichlet", "--clients", "3",
                      "--alpha", "0.2", "--seed", "7", "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    clients = summary["clients"]
    assert len(clients) == 3
    assert sum(c["samples"] for c in clients) == summary["train_samples"]
    assert all(sum(c["label_histogram"]) == c["samples"] > 0 for c in clients)
    assert summary["partition"] == {"scheme": "dirichlet", "clients": 3, "alpha": 0.2, "seed": 7}


def test_table_output_names_clients_and_classes():
    result = describe("--partition", "iid", "--clients", "4")
    assert result.exit_code == 0, result.output
    assert "iid partition over 4 clients" in result.stdout
    assert "client-3" in result.stdout and "675" in result.stdout


def test_recordings_spec_through_the_command_line(fsdd_slice, tmp_path, monkeypatch):
    needs_spafe()
    monkeypatch.setenv("MGFL_CACHE_DIR", str(tmp_path))
    result = describe("--data", f"fsdd:{fsdd_slice}", "--json")
    assert result.exit_code == 0, result.output
    assert [c["name"] for c in json.loads(result.stdout)["clients"]] == ["jackson", "theo"]


def test_bad_input_is_one_line_and_exit_code_2():
    result = describe("--data", "cifar10")
    assert result.exit_code == 2
    assert "unknown data set" in result.output
    result = describe("--partition", "iid")
    assert result.exit_code == 2 and "num_clients" in result.output
