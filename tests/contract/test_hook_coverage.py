"""Every hook in `reame_core.hookspecs` has a test that proves its contract.

A new hook spec fails this test until a test is named for it here: write a small plugin in
`contract_plugins` and a test that can fail, or name the test elsewhere that already proves it.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from reame_core import hookspecs

ROOT = Path(__file__).parents[2]

CONTRACT = {
    # planning
    "reame_disk_need": "plugins/reame_diskkv/tests/test_diskkv_plugin.py::"
    "test_the_host_plan_grants_diskkv_a_quarter_of_the_free_disk_up_to_its_cap",
    # lifecycle
    "reame_configure": "tests/contract/test_lifecycle.py::"
    "test_configure_comes_first_shutdown_last_and_each_candidate_starts_and_finishes_once",
    "reame_request_extensions": "tests/contract/test_lifecycle.py::"
    "test_claimed_field_reaches_every_candidates_extensions",
    "reame_check_request": "tests/contract/test_lifecycle.py::"
    "test_refusing_plugin_answers_400_with_its_own_message",
    "reame_sequence_started": "tests/contract/test_lifecycle.py::"
    "test_configure_comes_first_shutdown_last_and_each_candidate_starts_and_finishes_once",
    "reame_generation_finished": "tests/contract/test_lifecycle.py::"
    "test_cancelled_candidates_are_finished_once_with_reason_cancelled",
    "reame_threads_changed": "tests/unit/test_cpu_share.py::"
    "test_plugins_with_llama_contexts_of_their_own_hear_the_new_thread_count",
    "reame_shutdown": "tests/contract/test_lifecycle.py::"
    "test_configure_comes_first_shutdown_last_and_each_candidate_starts_and_finishes_once",
    # memory
    "reame_remember_answer": "tests/contract/test_memory.py::"
    "test_a_repeated_request_is_answered_from_memory_with_the_same_output",
    "reame_recall_answer": "tests/contract/test_memory.py::"
    "test_a_repeated_request_is_answered_from_memory_with_the_same_output",
    # prefill
    "reame_prefix_lookup": "tests/contract/test_prefill.py::"
    "test_snapshot_stored_at_the_plugins_point_is_restored_by_another_engine",
    "reame_prefix_store_points": "tests/contract/test_prefill.py::"
    "test_snapshot_stored_at_the_plugins_point_is_restored_by_another_engine",
    "reame_prefix_store": "tests/contract/test_prefill.py::"
    "test_snapshot_stored_at_the_plugins_point_is_restored_by_another_engine",
    "reame_prefix_computing": "tests/contract/test_prefill.py::"
    "test_a_withdrawn_promise_ends_the_wait_and_the_prefix_is_computed",
    "reame_prefix_pending": "tests/contract/test_prefill.py::"
    "test_an_engine_waits_for_the_prefix_another_promised_and_restores_it",
    # drafting
    "reame_propose_drafts": "tests/contract/test_drafting.py::"
    "test_third_party_drafts_are_verified_and_the_right_ones_committed",
    "reame_draft_cost": "tests/contract/test_drafting.py::"
    "test_a_source_that_says_its_calls_cost_more_than_drafts_save_is_never_asked",
    # verifying
    "reame_constrain_logits": "tests/contract/test_verifying.py::"
    "test_constraint_decides_every_token",
    "reame_forced_end": "tests/contract/test_verifying.py::"
    "test_a_forced_ending_is_committed_without_computing_its_steps",
    "reame_verify_drafts": "tests/contract/test_verifying.py::"
    "test_verifier_plugin_replaces_the_builtin_and_output_stays_the_plain_one",
    # accounting
    "reame_drafts_verified": "tests/contract/test_accounting.py::"
    "test_verified_drafts_add_up_to_the_usage_counters",
    "reame_tokens_committed": "tests/contract/test_accounting.py::"
    "test_committed_tokens_are_exactly_the_returned_tokens",
    # selection
    "reame_plan_candidates": "tests/contract/test_selection.py::"
    "test_best_of_runs_n_candidates_streams_nothing_before_choosing_and_returns_the_likeliest",
    "reame_select_candidates": "tests/contract/test_selection.py::"
    "test_stop_others_ends_the_unfinished_candidates_at_once",
    "reame_answer_extractors": "plugins/reame_conclave/tests/test_conclave_plugin.py::"
    "test_a_settled_vote_stops_the_running_candidates_and_frees_their_slots",
    # reporting
    "reame_describe": "tests/contract/test_reporting.py::"
    "test_description_is_the_plugins_line_in_the_listing",
    "reame_collect_stats": "tests/contract/test_reporting.py::"
    "test_collected_counters_are_in_the_metrics",
    # command line
    "reame_add_options": "tests/unit/test_cli.py::"
    "test_plugin_flag_sets_the_plugin_setting_over_the_environment",
    "reame_add_request_options": "tests/unit/test_cli.py::"
    "test_plugin_request_flag_sets_the_field_of_each_request_the_run_makes",
    "reame_add_commands": "tests/unit/test_cli.py::"
    "test_plugin_command_runs_with_settings_and_plugin_flags",
}


def hook_specs() -> set[str]:
    marker = f"{hookspecs.PROJECT}_spec"
    return {
        name
        for name, function in inspect.getmembers(hookspecs, inspect.isfunction)
        if hasattr(function, marker)
    }


def test_every_hook_spec_names_a_contract_test() -> None:
    specs = hook_specs()

    assert sorted(specs - CONTRACT.keys()) == [], "hooks without a contract test"
    assert sorted(CONTRACT.keys() - specs) == [], "contract tests of hooks that are gone"


def test_every_named_contract_test_exists() -> None:
    missing = []
    for test in set(CONTRACT.values()):
        path, _, name = test.partition("::")
        tree = ast.parse((ROOT / path).read_text())
        functions = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
        if name not in functions:
            missing.append(test)
    assert missing == []
