"""Names vulture cannot see used in draftsync/: a framework calls or reads them, or code outside the package does.

`make lint` passes this file to vulture with draftsync/; it is never imported. Dead code is deleted, not listed.
"""

# Typer calls the app's callback and the commands the sub-apps register by decorator.
_.main_options
_.register

# pydantic reads model_config and runs the validators its decorators register; pydantic-settings calls
# settings_customise_sources with every source by keyword.
_.model_config
_._a_trained_method
_._known_tasks_with_shares
_._endpoint_only_for_external
_._no_flags_draftsync_sets
_._known_profile
_._known_timezone
_._offered_gpu_count
_._nodes_meet_somewhere
_._speculators_trains_eagle3
_._gamma_within_the_block
_.settings_customise_sources
_.dotenv_settings

# Alembic reads each revision module's place in the chain and runs its downgrade.
_.down_revision
_.branch_labels
_.depends_on
_.downgrade

# SQLAlchemy reads a TypeDecorator's impl and cache_ok and calls its hooks; its handle_error event reads
# is_disconnect off the context.
_.impl
_.cache_ok
_.process_bind_param
_.process_result_value
_.is_disconnect

# Set on library objects that read them: sqlite3's row factory, the tokenizers pipeline, Great Expectations'
# progress bars, and the transformers config that save_pretrained writes to config.json.
_.row_factory
_.pre_tokenizer
_.decoder
_.progress_bars
_.draftsync_drafter

# Parameters a caller fixes: Prefect's retry_condition_fn(task, task_run, state), __exit__, and the process id
# that keys the functools.cache of one HTTP client per process.
_.task_run
_.exc_type
_.process_id

# Named only in a quoted type (a cast whose import is under TYPE_CHECKING).
_.PreTrainedModel

# Dataclass fields written out whole (asdict, fields() or records.record_dict) as JSON: `status --json`, a sync's
# result and its dataset, a validation's, `recommend --json`'s memory budget, the training report a data-parallel
# run's ranks hand back.
_.acceptance_7d
_.target_weights_gb
_.drafter_share
_.kv_headroom_share
_.kv_headroom_gb
_.required_gb
_.available_gb
_.holdout_positions
_.warm_start_tensors
_.trainable_held
_.stages_s
_.loss_tokens
_.speculation_schedule_note
_.trained_for_target_version
_.acceptance_quantiles

# train/speculators.py's scale-out API, as docs/TRAINING.md shows it.
_.write_token_rows
_.run_job
_.render_commands

# Read by bench/: a version's creation time (sync_latency), signed deliveries (reliability_load), one training
# step's batch (dataset_memory), the rollups recomputed from samples (monitor_scale).
_.created_ms
_.sign_delivery
_.batch_for_step
_.hourly_rows

# `draftsync status --json` fields (cli/status_query.py's DeploymentStatus), read by its users, and the tokenizer
# attribute transformers' save_pretrained writes out (speculative/builtin/tokenizer.py).
_.draft_tokens_7d
_.pooled_acceptance_7d
_.pooled_draft_tokens_7d
_.replaced_pairs
_.review_error
_.mtp_heads  # TargetStatus: status.json and the heading read it through asdict
_.chat_template
_.acceptance_rate_lower  # DraftSamplingFigures: validation.json's draft_sampling reads it
