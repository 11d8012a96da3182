"""Break the code on purpose and check that the tests guarding it fail.

    python -m tools.mutants [NAME ...]

Each mutant (``tools/mutant_patches.py``) replaces one named seam -- a method, a function, a hook --
in every process of a test run: ``T2I_MUTANT=NAME`` with ``tools/mutant_site`` on ``PYTHONPATH``,
whose ``sitecustomize`` applies it at interpreter start. No source file is edited, so the mutants
survive reformatting. A mutant that survives (its tests pass) is a test that cannot fail; the
script exits non-zero then. Not part of the CI suite: it takes several minutes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tools.mutant_patches import MUTANTS

ROOT = Path(__file__).resolve().parent.parent

ROUND_TWO = "tests/server/test_hostile_round_two.py"
# The tests that must catch each mutant (pytest node ids).
TESTS: dict[str, str] = {
    "no-gate": "tests/unit/test_gate.py::test_eight_concurrent_requests_never_overlap_in_inference "
    "tests/unit/test_joining.py::test_max_batch_size_bounds_the_images_in_the_loop",
    "gate-wraps-whole-request": "tests/unit/test_gate.py::test_preparation_overlaps_another_inference "
    "tests/unit/test_gate.py::test_finalize_overlaps_the_next_inference",
    "no-gate-and-a-thread-per-job": "tests/unit/test_model.py::test_the_same_load_through_the_adapter_never_races",
    "to-thread-releases-the-gate-on-cancel": (
        "tests/unit/test_cancel.py::test_cancel_mid_inference_stops_within_one_step_and_holds_the_gate"
    ),
    "batch-ignores-compatibility": "tests/unit/test_batching.py::test_incompatible_requests_are_not_merged",
    "no-batching": (
        "tests/unit/test_batching.py::test_compatible_waiting_requests_share_one_job_and_keep_their_own_images"
    ),
    "batch-ignores-max-size": "tests/unit/test_batching.py::test_max_batch_size_bounds_the_images_in_a_job",
    "img2img-loop-member-ignores-strength": "tests/unit/test_joining_families.py::test_image_to_image_members_join_a_text_loop_at_their_own_first_timestep",
    "step-cache-decision-shared-across-rows": (
        "tests/unit/test_joining_families.py::test_a_cached_member_that_joins_mid_way_draws_what_it_draws_alone"
    ),
    "fbcache-one-decision-for-the-batch": (
        "tests/unit/test_joining_families.py::test_first_block_cache_decides_per_row_and_a_joined_member_draws_what_it_draws_alone"
    ),
    "flux-control-lost-under-fbcache": "tests/unit/test_control_loops.py::test_on_flux_a_control_beside_first_block_cache_is_added_after_each_block_as_the_transformer_adds_it",
    "controlnet-one-map-for-the-batch": ("tests/unit/test_control_loops.py"),
    "several-models-share-a-loop": (
        "tests/server/test_several_models.py::test_users_alternating_between_models_each_get_their_models_picture"
    ),
    "joiners-pass-another-models-request": (
        "tests/server/test_several_models.py::test_a_rare_models_request_waits_one_round_not_the_whole_backlog"
    ),
    "img2img-never-joins-loops": "tests/server/test_image_modes_app.py::test_image_to_image_joins_a_running_text_loop_and_still_equals_the_plain_pipeline",
    "img2img-never-shares-calls": "tests/unit/test_image_requests.py::test_image_modes_run_their_steps_through_the_same_line_and_join_text_loops_only_where_the_model_can",
    "image-modes-join-text-loops": "tests/unit/test_image_requests.py::test_image_modes_run_their_steps_through_the_same_line_and_join_text_loops_only_where_the_model_can",
    "one-cancel-stops-the-batch": "tests/unit/test_batching.py::test_cancelling_one_member_does_not_fail_the_others",
    "oom-no-retry": "tests/unit/test_batching.py::test_out_of_memory_in_a_batch_is_retried_one_request_at_a_time",
    "skip-in-progress": "tests/server/test_lifecycle.py::test_progress_outputs_never_rebuild_a_component",
    "ray-replica-without-a-gate": (
        "tests/server/test_ray.py::test_requests_spread_over_both_replicas_one_inference_each_at_a_time"
    ),
    "ray-cancel-not-forwarded": "tests/server/test_ray.py::test_cancel_stops_the_remote_job_at_the_next_step",
    "no-disconnect-watch": "tests/server/test_lifecycle.py::test_a_dropped_connection_stops_the_job",
    "stop-answers-at-once": "tests/browser/test_browser.py::test_stop_cancels_the_running_job",
    "no-steps-validation": "tests/server/test_fuzz.py::test_raw_http_fuzz",
    "no-sweeper": "tests/server/test_load.py::test_soak_memory_and_files_level_off",
    "plain-close-on-signal": "tests/server/test_shutdown.py",
    "zerogpu-passes-the-stop-event": "tests/server/test_zerogpu_app.py::test_the_app_on_zerogpu_serves_each_user_in_their_own_context",
    "zerogpu-runs-outside-the-users-context": (
        "tests/server/test_zerogpu_app.py::test_the_app_on_zerogpu_serves_each_user_in_their_own_context"
    ),
    "liveness-watch-never-looks": "tests/server/test_lifecycle.py::test_a_dropped_connection_stops_the_job",
    "model-process-never-hears-stop": "tests/unit/test_model_process.py::test_stop_reaches_the_model_process_at_its_next_step",
    "model-process-not-restarted": (
        "tests/unit/test_model_process.py::test_a_killed_model_process_fails_its_job_at_once_and_the_next_job_waits_for_the_new_one "
        "tests/server/test_model_process_app.py::test_the_running_app_heals_when_its_model_process_is_killed_mid_job"
    ),
    "recovering-not-reported": (
        "tests/server/test_model_process_app.py::test_the_running_app_heals_when_its_model_process_is_killed_mid_job"
    ),
    "join-ignores-compatibility": "tests/unit/test_joining.py::test_different_samplers_never_share_a_loop "
    "tests/unit/test_joining.py::test_joiners_enter_in_fifo_order_and_an_incompatible_head_is_never_overtaken",
    "leave-drops-another-member": "tests/unit/test_joining.py::test_cancelling_one_member_leaves_the_others_untouched",
    "joiner-waits-for-the-end": "tests/unit/test_joining.py::test_a_joiner_is_sent_a_step_early_and_enters_as_the_leaving_member_goes",
    "early-joiner-not-held": "tests/unit/test_joining.py::test_the_model_side_follows_the_schedulers_tags_and_decides_nothing",
    "joiners-skip-the-fair-head": "tests/unit/test_scheduler.py::test_a_request_that_cannot_join_holds_back_every_compatible_one_behind_it "
    "tests/server/test_fair_share_app.py::test_a_request_that_cannot_join_waits_one_loop_behind_a_single_users_long_backlog "
    "tests/unit/test_joining.py::test_joiners_enter_in_fifo_order_and_an_incompatible_head_is_never_overtaken",
    "swap-does-nothing": "tests/browser/test_page.py::test_a_preset_sets_the_size_and_swap_exchanges_width_and_height",
    "history-restores-nothing": (
        "tests/browser/test_page.py::test_history_keeps_two_generations_restores_one_and_downloads_all"
    ),
    "paste-fills-nothing": (
        "tests/browser/test_page.py::test_pasted_parameters_fill_the_controls_and_say_what_was_not_applied"
    ),
    "escape-does-nothing": "tests/browser/test_page.py::test_enter_generates_and_escape_stops",
    "unbounded-inputs": "tests/server/test_hostile.py::test_a_megabyte_paste_is_refused_at_once_and_health_keeps_answering",
    "files-pass-the-door": "tests/server/test_hostile.py::test_file_shaped_payloads_are_refused_before_gradio_fetches_anything",
    "every-route-open": "tests/server/test_hostile.py::test_urls_and_closed_routes_fetch_nothing",
    "sessions-not-owned": (
        "tests/server/test_hostile.py::test_history_and_zip_come_only_from_what_the_server_wrote_for_that_session"
    ),
    "no-join-rate": (
        "tests/server/test_hostile.py::test_a_flood_of_fresh_sessions_is_refused_and_a_waiting_users_job_and_history_stay"
    ),
    "one-login-one-user": "tests/server/test_hostile.py::test_two_people_on_one_login_from_two_addresses_both_get_in",
    "forwarded-for-believed": (
        "tests/server/test_hostile.py::test_forged_and_repeated_forwarded_for_headers_name_nobody_else tests/unit/test_identity.py"
    ),
    "mcp-caller-unsealed": "tests/server/test_mcp.py::test_an_mcp_caller_is_who_it_connects_from_not_what_its_headers_say",
    "mcp-outside-the-login": "tests/server/test_mcp.py::test_under_auth_mcp_needs_the_login_and_works_with_basic_or_bearer",
    "mcp-disconnect-ignored": "tests/server/test_mcp.py::test_an_mcp_caller_that_disconnects_stops_its_job",
    "no-cost-budget": "tests/server/test_hostile.py::test_an_over_budget_request_is_refused_before_the_queue",
    "upload-pixel-cap-removed": "tests/unit/test_uploads.py::test_the_bombs_are_refused_before_any_pixel_is_decoded",
    "upload-left-unswept": "tests/unit/test_upload_book.py::test_an_upload_is_its_senders_only_and_is_swept_when_it_expires",
    "url-value-fetched": "tests/server/test_image_modes_app.py::test_an_event_may_name_only_its_callers_own_upload",
    "api-requests-skip-the-fair-line": "tests/server/test_peer_apis_line.py::"
    "test_a_flood_through_sdapi_keeps_its_cap_and_a_page_user_waits_behind_one_job",
    "interrupt-acts-globally": "tests/server/test_peer_apis.py::test_progress_and_interrupt_act_on_the_callers_own_job_only",
    "stop-by-poll": "tests/server/test_peer_apis.py::test_progress_and_interrupt_act_on_the_callers_own_job_only",
    "quota-per-protocol": "tests/server/test_peer_apis_line.py::test_the_quota_counts_every_protocol_together",
    "upload-any-session": "tests/unit/test_upload_book.py::test_an_upload_belongs_to_the_session_that_names_it_first "
    "tests/server/test_image_modes_app.py::test_an_event_may_name_only_its_callers_own_upload",
    "no-connection-limits": (
        "tests/server/test_hostile.py::test_slow_headers_a_huge_body_and_too_many_connections_are_cut_off"
    ),
    "full-disk-leaves-a-tmp": "tests/unit/test_limits.py::test_a_full_disk_says_retry_later_and_leaves_no_partial_file",
    "temp-files-kept": "tests/server/test_hostile.py::test_gradio_temp_file_sets_stay_bounded_under_a_soak",
    "shares-ignored": (
        "tests/unit/test_sweeper.py::test_over_budget_only_identities_over_their_share_lose_files_and_the_unowned_go_first"
    ),
    "prompt-lines-kept": "tests/unit/test_a1111.py::test_a_prompts_line_breaks_cannot_plant_lines_and_quoted_values_round_trip "
    "tests/server/test_hostile.py::test_a_prompts_newlines_plant_no_metadata_and_the_paste_reads_it_back",
    "notes-rendered": "tests/unit/test_a1111.py::test_the_notes_are_plain_text",
    "ui-events-unbounded": "tests/server/test_hostile.py::test_a_megabyte_paste_is_refused_at_once_and_health_keeps_answering",
    "auto-limit-off": "tests/unit/test_limits.py::test_without_job_timeout_each_job_is_limited_by_the_measured_rate",
    "paste-regex-backtracks": "tests/unit/test_a1111.py::test_the_parser_reads_a_megabyte_of_its_worst_cases_in_one_pass",
    "guidance-always-guidance-scale": (
        "tests/server/test_family_matrix_2026.py::test_the_same_pixels_as_a_plain_diffusers_call_and_the_controls[qwen-image]"
    ),
    "packed-previews-not-unpacked": "tests/server/test_family_matrix_2026.py::test_progress_cancel_and_previews[flux2-dev]",
    "previews-for-everyone": "tests/server/test_live_previews.py",
    "previews-at-full-size": "tests/server/test_live_previews.py "
    "tests/server/test_model_process_app.py::test_a_step_crosses_as_a_few_bytes_and_a_preview_as_a_small_jpeg",
    "previews-every-step": "tests/server/test_model_process_app.py::test_a_step_crosses_as_a_few_bytes_and_a_preview_as_a_small_jpeg",
    "z-image-loop-without-guidance": (
        "tests/unit/test_joining_families.py::test_the_same_images_alone_and_after_joining_mid_run[z-image-default]"
    ),
    "lora-adapter-ignored": "tests/unit/test_lora.py::test_an_adapter_changes_the_picture_and_equals_plain_diffusers",
    "lora-previous-adapter-leaks": "tests/unit/test_lora.py::test_none_equals_no_adapters_and_the_last_adapter_never_leaks",
    "lora-mixed-batch-one-adapter": (
        "tests/unit/test_lora.py::test_members_with_different_adapters_share_each_denoiser_call_with_their_own_pixels"
    ),
    "json-string-pattern-backtracks": "tests/unit/test_hostile_round_three.py::test_the_json_depth_check_is_linear_at_the_body_cap",
    "lora-tag-backtracks": "tests/unit/test_hostile_round_three.py::test_the_lora_tag_and_the_comma_tidy_are_linear_at_the_body_cap",
    "decode-work-uncapped": "tests/unit/test_hostile_round_three.py::test_the_work_bombs_are_refused_from_their_bytes_before_any_pixel "
    "tests/server/test_hostile_round_three.py::test_a_jpeg_of_100000_scans_to_every_image_input",
    "png-info-composes-frames": "tests/server/test_hostile_round_three.py::test_an_animated_png_of_100000_frames_to_every_image_input",
    "pictures-decoded-before-the-gates": "tests/unit/test_hostile_round_three.py::test_the_quota_and_the_waiting_cap_answer_before_any_picture_is_decoded",
    "decodes-in-the-shared-pool": "tests/unit/test_hostile_round_three.py::test_each_identity_decodes_one_request_at_a_time_on_threads_of_their_own",
    "quota-given-back-after-steps": "tests/unit/test_quota.py::test_a_request_that_ran_a_step_has_spent_its_images_whatever_ends_it "
    "tests/server/test_hostile_round_three.py::test_an_interrupt_at_the_last_step_and_a_dropped_stream_both_spend_the_quota",
    "quota-per-address": "tests/server/test_hostile_round_three.py::test_one_login_from_six_addresses_gets_its_quota_once",
    "api-success-counted-cancelled": "tests/unit/test_hostile_round_three.py::test_an_api_caller_that_returns_at_its_images_is_counted_completed "
    "tests/server/test_hostile_round_three.py::test_an_api_success_is_counted_completed",
    "large-bodies-read-at-once": "tests/server/test_hostile_round_three.py::test_six_bodies_of_51_mib_are_read_off_the_loop_and_memory_comes_back",
    "large-bodies-memory-kept": "tests/server/test_hostile_round_three.py::test_six_bodies_of_51_mib_are_read_off_the_loop_and_memory_comes_back",
    "thread-off-the-map": "tests/server/test_concurrency_map.py::test_every_thread_of_a_running_app_is_on_the_map",
    # Issue 35: hostile clients, round two.
    "failed-logins-not-metered": f"{ROUND_TWO}::test_basic_bearer_and_form_guesses_are_metered_and_past_the_budget_nothing_is_compared",
    "heartbeat-outside-the-login": f"{ROUND_TWO}::test_under_auth_every_route_but_the_login_pages_needs_the_login_the_heartbeat_too "
    "tests/server/test_routes_guarded.py",
    "owner-folders-unkeyed": f"{ROUND_TWO}::test_an_image_url_cannot_be_traced_to_an_address_and_the_key_is_never_served",
    "text-not-validated": f"{ROUND_TWO}::test_a_lone_surrogate_is_a_422_naming_the_field_on_every_event_and_health_stays_ok",
    "deep-json-parsed": f"{ROUND_TWO}::test_deep_json_is_a_400_on_every_route_with_no_traceback_and_cancels_take_rate_tokens",
    "cancels-not-rate-limited": f"{ROUND_TWO}::test_deep_json_is_a_400_on_every_route_with_no_traceback_and_cancels_take_rate_tokens",
    "door-lets-tracebacks-through": "tests/unit/test_frontdoor.py::test_a_fault_below_the_door_is_a_500_and_one_log_line_without_the_stack",
    "call-results-unowned": f"{ROUND_TWO}::test_a_call_result_answers_only_the_identity_that_asked",
    # Issue 36: a real GPU's failures.
    "sticky-error-carried-on": "tests/unit/test_device_faults.py "
    "tests/server/test_device_faults_app.py::test_a_sticky_device_error_heals_and_the_next_request_gets_images_within_a_minute",
    "allocation-failure-not-memory": "tests/unit/test_device_faults.py",
    "joiner-ignores-device-memory": "tests/unit/test_joining.py::test_a_joiner_that_would_not_fit_in_device_memory_waits_for_the_next_loop",
    "offload-chain-left-to-itself": "tests/unit/test_offload_joining.py",
    "compiled-batch-static": "tests/server/test_compile.py::test_members_joining_and_leaving_a_loop_never_recompile_after_the_warm_up",
    "previews-fitted-in-half": "tests/server/test_previews_half.py "
    "tests/server/test_live_previews.py::test_an_sdxl_in_float16_whose_vae_overflows_shows_previews_through_the_app",
    "oom-freed-while-members-live": "tests/unit/test_device_faults.py::test_out_of_memory_in_a_loop_frees_memory_only_once_the_failed_members_are_dropped",
    "disk-share-shrinks-with-identities": f"{ROUND_TWO}::test_a_many_identity_disk_attack_leaves_the_victim_every_image_within_its_lifetime "
    "tests/unit/test_sweeper.py::test_many_identities_cannot_shrink_a_victims_floor_they_are_deleted_first",
}


def run(name: str) -> bool:
    """True if the tests caught the mutant (failed)."""
    env = dict(os.environ)
    env["T2I_MUTANT"] = name
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT / "tools" / "mutant_site"), str(ROOT), os.environ.get("PYTHONPATH", "")) if p
    )
    # -n 0: the few tests in this process (pytest-xdist's workers would cost more than they run)
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-x",
        "-n",
        "0",
        "-p",
        "no:cacheprovider",
        "-m",
        "",
        *TESTS[name].split(),
    ]
    result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    last = (result.stdout.strip().splitlines() or ["(no output)"])[-1]
    # Caught: a test failed. A crash before any test ran (exit 2-5) catches nothing: it is a broken harness.
    caught = result.returncode == 1 and " failed" in last
    if result.returncode not in (0, 1):
        print(result.stdout[-2000:], result.stderr[-2000:], sep="\n")
    print(f"{'caught  ' if caught else 'SURVIVED'} {name}: {last}", flush=True)
    return caught


def main(names: list[str]) -> int:
    unknown = set(names) - set(MUTANTS)
    if unknown or set(TESTS) != set(MUTANTS):
        raise SystemExit(f"unknown mutants {sorted(unknown)} or mutants without tests")
    return 0 if all([run(name) for name in names or list(MUTANTS)]) else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
