"""DYNSPEC_POLICY_CONTROL on the real SGLang 0.5.9 server, patched, on this CPU (tiny crafted models).

One patched server starts with DYNSPEC_POLICY=never and a control file; `always` written into
the file takes over within a few requests, without a restart, and greedy output stays the same.
"""

from __future__ import annotations

import time

import pytest

pytest.importorskip("torch", reason="requirements/sglang-cpu.txt installs the CPU torch")
pytestmark = pytest.mark.slow

from dynspec.io.atomic import write_text  # noqa: E402
from dynspec.live.server_info import dynspec_state  # noqa: E402
from dynspec.realsglang.arms import Arm, greedy, server_info, shrinking_prompts, start_arms  # noqa: E402
from dynspec.sglang.policy_control import POLL_INTERVAL_S  # noqa: E402

from test_real_sglang import LOGS  # noqa: E402


def test_writing_always_into_the_control_file_switches_a_running_never_server(tmp_path):
    from dynspec.realsglang.tinymodels import make_models

    models = tmp_path / "models"
    make_models(models)
    control = tmp_path / "dynspec-policy"
    write_text(control, "never\n")
    arm = Arm("patched-control", patched=True, policy="never", env={"DYNSPEC_POLICY_CONTROL": str(control)})
    prompts, lengths = shrinking_prompts(2)
    with start_arms([arm], models, LOGS / time.strftime("%Y%m%d-%H%M%S-control")) as servers:
        server = servers[arm.name]
        before = greedy(server, prompts, lengths, 1)
        st = dynspec_state(server_info(server))
        assert st is not None
        assert (st["policy"], st["policy_swaps"], st["steps_spec"]) == ("never", 0, 0)
        assert st["policy_control"] == str(control) and st["steps_plain"] > 0

        assert server.flush_cache() == ""  # a sweep empties the prefix cache between arms on one server
        write_text(control, "always\n")
        time.sleep(2 * POLL_INTERVAL_S)  # the next decode step after this polls
        after = None
        for _ in range(3):  # within a few requests
            after = greedy(server, prompts, lengths, 1)
            st = dynspec_state(server_info(server))
            assert st is not None
            if st["steps_spec"] > 0:
                break
        assert (st["policy"], st["policy_swaps"], st["mode"]) == ("always", 1, "spec")
        assert st["steps_spec"] > 0 and st["drafts_accepted"] > 0
        assert after is not None and [r["ids"] for r in after] == [r["ids"] for r in before]
        # back to never after a flush in the speculative stretch: the draft's state and the pending
        # KV-only rows are dropped with the pool, and greedy output still holds
        assert server.flush_cache() == ""
        write_text(control, "never\n")
        time.sleep(2 * POLL_INTERVAL_S)
        again = greedy(server, prompts, lengths, 2)
        st = dynspec_state(server_info(server))
        assert st is not None and (st["policy"], st["policy_swaps"], st["mode"]) == ("never", 2, "plain")
        assert [r["ids"] for r in again] == [r["ids"] for r in before]
        log = server.log_path.read_text(errors="replace")
        assert log.count("dynspec: policy never -> always at step") == 1
