"""code_execution_reward: the fraction of a row's test cases a completion's program passes, with every
program run confined, and hostile ones scoring 0 without stopping the batch or the process.

Every test runs real programs in the real sandbox (no mocks): what is promised is what the sandbox does.
"""

from __future__ import annotations

import json
import os
import socket
import time
import warnings

import pytest

from grpo_lightning.rewards import CodeExecutionReward, code_execution_reward
from grpo_lightning.rewards.sandbox import assert_tests
from grpo_lightning.rewards.sandbox import command as sandbox_command
from grpo_lightning.rewards.code_execution import extract_code

TIMEOUT_S = 2.0
ADD = "def add(a, b):\n    return a + b\n"
ADD_TESTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(2, 2) == 4", "assert add(0, 0) == 0"]
SUM_STDIN = "print(sum(map(int, input().split())))\n"


def fenced(source: str, tag: str = "python") -> str:
    return f"Here is my solution.\n```{tag}\n{source}```\nIt reads the input and prints the sum."


@pytest.fixture(scope="module")
def reward(sandbox_backend) -> CodeExecutionReward:
    return CodeExecutionReward(timeout_s=TIMEOUT_S, memory_mb=256, workers=2, sandbox=sandbox_backend)


def score(reward, source: str, tests) -> float:
    return reward(["prompt"], [fenced(source)], test_cases=[tests])[0]


def stdio(output: str, stdin: str = "") -> list[dict]:
    return [{"input": stdin, "output": output}]


# What is scored


@pytest.mark.parametrize("as_message", [False, True], ids=["text", "chat message"])
def test_a_correct_program_scores_one(reward, as_message):
    completion = [{"role": "assistant", "content": fenced(ADD)}] if as_message else fenced(ADD)
    assert reward(["prompt"], [completion], test_cases=[ADD_TESTS]) == [1.0]


def test_the_score_is_the_fraction_of_tests_passed(reward):
    wrong_for_negatives = "def add(a, b):\n    return abs(a) + abs(b)\n"
    tests = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(-2, -2) == -4", "assert add(0, 0) == 0"]
    assert score(reward, wrong_for_negatives, tests) == 0.5


def test_stdin_tests_compare_stdout_with_trailing_whitespace_stripped(reward):
    tests = [
        {"input": "1 2\n", "output": "3"},
        {"input": "5 5\n", "output": "10  \n\n"},
        {"input": "1 1", "output": "3"},
    ]
    assert score(reward, SUM_STDIN, tests) == pytest.approx(2 / 3)


@pytest.mark.parametrize(
    "tests",
    [json.dumps(ADD_TESTS), json.dumps([{"input": "2 3\n", "output": "5\n"}])],
    ids=["asserts", "stdio"],
)
def test_test_cases_may_be_a_json_string(reward, tests):
    source = ADD if "assert" in tests else SUM_STDIN
    assert score(reward, source, tests) == 1.0


def test_a_completion_without_a_code_block_scores_zero(reward):
    assert reward(["prompt"], ["def add(a, b): return a + b"], test_cases=[ADD_TESTS]) == [0.0]


def test_the_last_python_block_is_the_program_else_the_last_block():
    text = "```python\nfirst\n```\n```bash\nls\n```\n```py\nsecond\n```\n```\nplain\n```"
    assert extract_code(text) == "second\n"
    assert extract_code("```\none\n```\n```text\ntwo\n```") == "two\n"
    assert extract_code("no code here") is None


def test_a_row_without_tests_is_not_scored(reward):
    assert reward(["p", "p"], [fenced(ADD)] * 2, test_cases=[None, []]) == [None, None]


def test_the_test_case_column_is_configurable(sandbox_backend):
    reward = CodeExecutionReward(column="tests", timeout_s=TIMEOUT_S, sandbox=sandbox_backend)
    assert reward(["prompt"], [fenced(ADD)], tests=[ADD_TESTS]) == [1.0]


def test_the_default_instance_reads_the_test_cases_column():
    assert code_execution_reward.column == "test_cases"
    assert code_execution_reward.__name__ == "code_execution_reward"


@pytest.mark.parametrize(
    "tests",
    [42, "not json", [1, 2], [{"input": "1"}], ["assert add(1,"], ["assert True", {"input": "", "output": ""}]],
    ids=["number", "bad JSON", "numbers", "no output", "bad syntax", "mixed"],
)
def test_malformed_test_cases_raise_a_value_error_naming_the_column_and_the_format(reward, tests):
    with pytest.raises(ValueError, match=r"column 'test_cases', row 0: .*expected a list of assert statements"):
        reward(["prompt"], [fenced(ADD)], test_cases=[tests])


def test_a_missing_test_case_column_raises_naming_it(reward):
    with pytest.raises(ValueError, match=r"test-case column 'test_cases'.*CodeExecutionReward\(column=\.\.\.\)"):
        reward(["prompt"], [fenced(ADD)], tests=[ADD_TESTS])


def test_a_sandbox_that_cannot_run_anything_raises_instead_of_scoring_zero(sandbox_backend):
    starved = CodeExecutionReward(memory_mb=1, sandbox=sandbox_backend)
    with pytest.raises(RuntimeError, match="could not run print"):
        starved(["prompt"], [fenced(ADD)], test_cases=[ADD_TESTS])


# Hostile programs: each contained, scored 0, and the process goes on


def test_an_infinite_loop_is_stopped_at_the_deadline(sandbox_backend):
    reward = CodeExecutionReward(timeout_s=1.0, sandbox=sandbox_backend)
    start = time.monotonic()
    assert score(reward, "while True:\n    pass\n", stdio("done")) == 0.0
    assert time.monotonic() - start < 3.0


def test_a_fork_bomb_is_contained(reward):
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    start = time.monotonic()
    assert score(reward, bomb, stdio("done")) == 0.0
    assert time.monotonic() - start < TIMEOUT_S + 2.0
    assert score(reward, ADD, ADD_TESTS) == 1.0  # and the next program runs as before


@pytest.mark.parametrize(
    "source",
    [
        "import os\nif os.fork() == 0:\n    print('child')\n",
        "import subprocess\nprint(subprocess.run(['echo', 'child'], capture_output=True, text=True).stdout)\n",
        "import os\nos.system('echo child')\n",
        "import os\nos.execv('/bin/echo', ['echo', 'child'])\n",
    ],
    ids=["fork", "subprocess", "system", "exec"],
)
def test_no_other_process_runs(reward, source):
    assert score(reward, source, stdio("child")) == 0.0


def test_memory_exhaustion_scores_zero(reward):
    assert score(reward, "data = b'x' * (1 << 34)\nprint('allocated')\n", stdio("allocated")) == 0.0


@pytest.mark.parametrize(
    "write",
    ["open(TARGET, 'w').write('x')", "os.close(os.open(TARGET, os.O_WRONLY | os.O_CREAT))", "os.mkdir(TARGET)"],
    ids=["open", "os.open", "mkdir"],
)
def test_writing_outside_its_directory_is_refused(reward, tmp_path, write):
    target = tmp_path / "escaped"
    source = f"import os\nTARGET = {str(target)!r}\n{write}\nprint('written')\n"
    assert score(reward, source, stdio("written")) == 0.0
    assert not target.exists()


def test_writing_inside_its_directory_works(reward):
    source = "open('notes.txt', 'w').write('kept')\nprint(open('notes.txt').read())\n"
    assert score(reward, source, stdio("kept")) == 1.0


def test_the_run_directory_is_removed_afterwards(reward):
    run = reward.run("stdio", "import os\nopen('left.txt', 'w').write('x')\nprint(os.getcwd())\n")
    assert run.status == 0
    assert not os.path.exists(run.output.decode().strip())


def test_environment_variables_are_not_readable(reward, monkeypatch):
    monkeypatch.setenv("GRPO_SANDBOX_SECRET", "hunter2")
    from_environ = "import os\nprint(os.environ.get('GRPO_SANDBOX_SECRET'))\n"
    from_parent = "import os\nprint(len(open(f'/proc/{os.getppid()}/environ').read()) > 0)\n"
    scores = reward(
        ["p", "p"], [fenced(from_environ), fenced(from_parent)], test_cases=[stdio("hunter2"), stdio("True")]
    )
    assert scores == [0.0, 0.0]


def test_no_network_connection_is_made(reward):
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        source = (
            f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1).sendall(b'hi')\nprint('sent')\n"
        )
        assert score(reward, source, stdio("sent")) == 0.0
        listener.settimeout(0.2)
        with pytest.raises(TimeoutError):
            listener.accept()


def test_printing_gigabytes_is_cut_off_at_the_output_cap(reward):
    flood = "import sys\nchunk = 'x' * (1 << 20)\nwhile True:\n    sys.stdout.write(chunk)\n"
    start = time.monotonic()
    assert score(reward, flood, stdio("x")) == 0.0
    assert time.monotonic() - start < TIMEOUT_S  # stopped by the cap, not the deadline


def test_a_program_cannot_report_passes_itself(reward):
    forger = (
        "import os\n"
        "for fd in range(1, 64):\n"
        "    try:\n"
        "        os.write(fd, b'0\\n1\\n')\n"
        "    except OSError:\n"
        "        pass\n"
        "os._exit(0)\n"
    )
    assert score(reward, forger, ["assert True", "assert 1 == 1"]) == 0.0


def test_passes_before_a_timeout_still_count(sandbox_backend):
    reward = CodeExecutionReward(timeout_s=1.0, sandbox=sandbox_backend)
    program = "def double(n):\n    while n == 3:\n        pass\n    return 2 * n\n"
    assert score(reward, program, ["assert double(1) == 2", "assert double(2) == 4", "assert double(3) == 6"]) == 2 / 3


def test_a_hostile_completion_does_not_affect_the_rest_of_its_batch(reward):
    completions = [fenced(ADD), fenced("while True:\n    pass\n"), fenced("import os\nos.kill(os.getppid(), 9)\n")]
    assert reward(["p"] * 3, completions, test_cases=[ADD_TESTS] * 3) == [1.0, 0.0, 0.0]


def test_completions_run_at_once_and_come_back_in_order(sandbox_backend):
    reward = CodeExecutionReward(timeout_s=1.0, workers=4, sandbox=sandbox_backend)
    sleeper = fenced("import time\ntime.sleep(60)\n")
    completions = [sleeper, fenced(ADD), sleeper, sleeper, "no code", sleeper]
    start = time.monotonic()
    scores = reward(["p"] * 6, completions, test_cases=[ADD_TESTS] * 6)
    assert scores == [0.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    assert time.monotonic() - start < 3.5  # one after another: 5 deadlines, 5 s


# Assert tests split: the sandbox returns each call's value, this process compares


@pytest.mark.parametrize(
    ("statement", "call", "passing", "failing"),
    [
        ("assert add(1, 2) == 3", "add(1, 2)", 3, 4),
        ("assert 3 == add(1, 2)", "add(1, 2)", 3.0, "3"),
        ("assert f(x) != [1]", "f(x)", (1,), [1]),
        ("assert f() is None", "f()", None, 0),
        ("assert f() is not False", "f()", 0, False),
        ("assert f() < 2.5", "f()", 2, 3),
        ("assert 'a' in f()", "f()", "cat", "dog"),
        ("assert f() in (1, 2)", "f()", 2, 3),
        ("assert f() == set([1, 2])", "f()", {2, 1}, [1, 2]),
        ("assert math.isclose(f(), 0.5, rel_tol=1e-3)", "f()", 0.5001, 0.6),
        ("assert abs(area(2) - 12.56) < 0.01", "area(2)", 12.566, 12.6),
        ("assert is_prime(7)", "is_prime(7)", True, 0),
        ("assert not is_prime(8)", "is_prime(8)", [], [0]),
        ("assert f() == 1, 'a message'", "f()", 1, 2),
    ],
)
def test_an_assert_test_splits_into_a_call_and_a_check_of_its_value(statement, call, passing, failing):
    (part,) = assert_tests.split(statement)
    assert part.call == call
    assert part.check(passing) and not part.check(failing)


def test_several_asserts_or_a_conjunction_split_into_parts_that_must_all_pass():
    parts = assert_tests.split("assert f(1) == 1 and f(2) == 4\nassert f(3) == 9")
    assert [part.call for part in parts] == ["f(1)", "f(2)", "f(3)"]
    assert [part.check(value) for part, value in zip(parts, (1, 4, 8))] == [True, True, False]


@pytest.mark.parametrize(
    "statement",
    [
        "assert (f(1) == 3) == True",  # the comparison would run where the program is
        "assert f(1) == g(2)",  # no expected value
        "assert f(1) == 3 or f(1) == 4",
        "assert check(f(1), lambda v: v == 3)",
        "assert f() is 300",  # identity of anything but None, True, False cannot cross
        "assert math.isclose(f(), 0.5, rel_tol=g())",
        "x = f(1)\nassert x == 3",
        "f(1)",
    ],
)
def test_tests_that_would_hide_their_check_in_the_call_do_not_split(statement):
    assert assert_tests.split(statement) is None


@pytest.mark.parametrize(
    "node",
    [
        ["int", "12"],
        ["float", "nan"],
        ["tuple", [["str", "a"], ["none"]]],
        ["dict", [["tuple", [["int", "1"], ["set", []]]]]],
    ],
    ids=["int", "float", "tuple", "dict"],
)
def test_only_plain_values_are_decoded(node):
    assert type(assert_tests.decode(node)) in (int, float, tuple, dict)


@pytest.mark.parametrize(
    "node",
    [["int", "9" * 5000], ["dict", [["list", []]]], ["list", [["list", [["object"]]]]], ["str", 1], "9", None],
    ids=["huge int", "dict of a list", "unknown tag", "wrong payload", "untagged", "null"],
)
def test_anything_else_is_undecodable(node):
    with pytest.raises(assert_tests.Undecodable):
        assert_tests.decode(node)


def test_a_test_that_does_not_split_runs_whole_and_is_warned_about(reward):
    tests = ["assert add(1, 2) == 3 or add(1, 2) == 4", "assert add(2, 2) == 4", "assert add(1, 1) == 3 or False"]
    fresh = CodeExecutionReward(timeout_s=TIMEOUT_S, memory_mb=256, sandbox=reward.sandbox)
    with pytest.warns(UserWarning, match=r"'assert add\(1, 2\) == 3 or add\(1, 2\) == 4' does not split"):
        assert score(fresh, ADD, tests) == pytest.approx(2 / 3)


# The backends


def test_without_bubblewrap_auto_falls_back_and_warns_once_naming_the_package(monkeypatch):
    monkeypatch.setattr(sandbox_command.shutil, "which", lambda name: None)
    sandbox_command.resolve.cache_clear()
    sandbox_command.bubblewrap_problem.cache_clear()
    try:
        with pytest.warns(UserWarning, match=r"without bubblewrap \(no `bwrap` on PATH\).*package `bubblewrap`"):
            assert sandbox_command.resolve("auto") == "python"
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert sandbox_command.resolve("auto") == "python"
        with pytest.raises(sandbox_command.SandboxUnavailable, match="sandbox='bubblewrap': no `bwrap` on PATH"):
            sandbox_command.resolve("bubblewrap")
    finally:
        sandbox_command.resolve.cache_clear()
        sandbox_command.bubblewrap_problem.cache_clear()


@pytest.mark.skipif(sandbox_command.bubblewrap_problem() is not None, reason="bubblewrap cannot run here")
def test_a_bwrap_that_cannot_size_a_tmpfs_is_warned_about_naming_the_version(monkeypatch):
    monkeypatch.setattr(sandbox_command, "bubblewrap_sizes_tmpfs", lambda: False)  # bubblewrap before 0.8
    sandbox_command.resolve.cache_clear()
    try:
        with pytest.warns(UserWarning, match=r"cannot size a tmpfs \(`--size`, bubblewrap 0.8\+\).*polling"):
            assert sandbox_command.resolve("bubblewrap") == "bubblewrap"
    finally:
        sandbox_command.resolve.cache_clear()


def test_a_seccomp_filter_that_cannot_be_loaded_stops_the_run_before_the_program(sandbox_backend, monkeypatch):
    monkeypatch.setattr(sandbox_command, "seccomp_filter", lambda: b"not a filter")
    reward = CodeExecutionReward(timeout_s=TIMEOUT_S, sandbox=sandbox_backend)
    with pytest.raises(RuntimeError, match=r"could not run print\('ok'\) \(exit status 125 \(its seccomp filter"):
        reward(["prompt"], [fenced(ADD)], test_cases=[ADD_TESTS])


def test_an_unknown_sandbox_is_a_value_error_naming_the_choices():
    with pytest.raises(ValueError, match="sandbox='docker' must be one of auto, bubblewrap, python"):
        CodeExecutionReward(sandbox="docker")
