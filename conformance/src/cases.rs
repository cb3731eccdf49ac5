//! Every behaviour of the suite, listed once in [`ALL`].
//!
//! Each case is a plain function `fn(&Fixture) -> CaseResult` named after the behaviour it
//! checks, generic over the backend (it uses only `cudabuf_core`'s API and the
//! [`Fixture`](crate::Fixture)), so the same list runs unchanged on the simulator and on
//! CUDA. A broken behaviour panics (`assert!`); errors are checked by
//! [`ErrorKind`](cudabuf_core::ErrorKind), never by message alone.
//!
//! The cases live in submodules by subject:
//! - `copies`: every copy path at sizes 0, 1 and 1000, and where bytes land;
//! - `ranges`: out-of-range arguments, their error kinds, and that a refused operation
//!   changes nothing;
//! - `slices`: slices alias their parent and keep its memory alive;
//! - `context`: devices, contexts, accounting, zero-size rules, copies versus views;
//! - `host`: pinned host buffers and device addresses;
//! - `reader` / `writer`: `BufferReader` and `BufferWriter`;
//! - `ipc`: IPC handles, in this process and in a child process;
//! - `allocator`: the caching allocator (freed memory through every context, a buffer's
//!   memory is its request, exported blocks of shared segments across processes);
//! - `streams`: streams, events, asynchronous copies, and racy programs next to their
//!   correctly synchronized twins;
//! - `streams_hostile`: one stream shared by threads, transfers outliving or forgotten
//!   by their stream, events across devices and contexts, a writer's copies in flight;
//! - `stream_alloc`: stream-ordered allocation on the caching allocator
//!   (`Context::new_buffer_on`): reuse by the same stream at once, by others after the
//!   free's event, IPC export, out-of-memory with pending frees;
//! - `reliability_*`: hostile input the modules above leave out, IPC handle bytes fuzzed,
//!   process faults around IPC (crashed, exited and killed peers), and a multi-thread
//!   load; `docs/RELIABILITY.md` maps every public operation to its cases.

use crate::model;
use crate::{Case, CaseFn};

mod allocator;
mod context;
mod copies;
mod expect;
mod files;
/// Also [`support::non_blocking`](crate::support::non_blocking), where it lives.
pub use crate::support::non_blocking;
pub use expect::require_streams;
mod host;
mod ipc;
mod pid_reuse;
mod ranges;
mod reader;
mod slices;
mod stream_alloc;
mod streams;
mod streams_hostile;
mod writer;

mod reliability_inputs;
mod reliability_ipc_fuzz;
mod reliability_leaks;
mod reliability_load;
mod reliability_process;

/// Builds the list of [`Case`]s from `module::function` paths, so that a case's name is
/// always its function's name; `module::function.alone()` or `.exclusive()` declares that
/// the case runs alone ([`Isolation`](crate::Isolation)).
macro_rules! cases {
    ($($module:ident :: $case:ident $(. $isolation:ident ())?),* $(,)?) => {
        &[$(Case::new(stringify!($case), $module::$case as CaseFn)$(.$isolation())?),*]
    };
}

/// Every case of the suite, named after its function. A case that must not run beside the
/// others says so here, and why: `.exclusive()` for what it checks (state that every case
/// of the process shares: on CUDA the device's caching allocator and the driver's
/// addresses, shared by every context over the device's primary context), `.alone()` to
/// keep a backend fault from hanging the suite ([`Isolation`](crate::Isolation)).
pub const ALL: &[Case] = cases![
    // streams
    streams::stream_copies_round_trip,
    streams::stream_runs_its_work_in_order,
    streams::stream_wait_event_orders_two_streams,
    streams::event_query_before_and_after,
    streams::event_elapsed_time_needs_timing_events,
    streams::foreign_stream_wrapping_never_destroys_it,
    streams::default_streams_take_work,
    streams::blocking_stream_is_ordered_with_synchronous_copies,
    streams::stream_copies_of_slices_land_in_place,
    streams::dropped_transfers_and_buffers_are_safe,
    streams::stream_copy_bad_arguments_are_typed_errors,
    streams::stream_peer_copy_between_devices,
    streams::race_read_on_other_stream_without_wait,
    streams::race_synchronous_read_after_non_blocking_write,
    streams::race_wait_on_an_event_recorded_too_early,
    streams::race_write_while_other_stream_reads,
    streams::race_per_thread_streams_of_two_threads,
    streams::race_on_pinned_memory_through_its_device_view,
    // streams under hostile use
    //
    // Until 2026-12-03 the next two ran alone (`.alone()`): beside each other and the
    // other stream cases on the H200 they hung every thread of the binary inside the
    // driver. The stacks (`CUDABUF_HANG_TRACE_SECS`) showed a thread ending, inside the
    // driver's thread-exit work, after copying on its per-thread stream without waiting,
    // and every other thread waiting for the driver's lock. The CUDA backend now
    // synchronizes a thread's per-thread stream as the thread ends (`cudabuf-cuda`,
    // `context/per_thread.rs`), and the two run beside the others again: 5 of 5 runs
    // passed, where 4 of 4 had hung (results/runs.md, 2026-12-03, night;
    // docs/RELIABILITY.md, section 6).
    streams_hostile::per_thread_stream_shared_by_threads_keeps_each_threads_staging,
    streams_hostile::stream_synchronized_by_another_thread_keeps_later_work,
    streams_hostile::stream_shared_by_threads_last_drop_waits_for_every_upload,
    streams_hostile::transfer_outlives_its_stream,
    streams_hostile::forgotten_transfer_leaks_only_what_it_owns,
    streams_hostile::stream_waits_for_an_event_of_another_device,
    streams_hostile::event_of_another_context_cannot_be_recorded_or_timed,
    streams_hostile::race_non_blocking_read_of_unflushed_writer_bytes,
    // stream-ordered allocation
    stream_alloc::stream_alloc_same_stream_reuses_a_block_at_once_in_order,
    stream_alloc::stream_alloc_other_stream_reuses_a_block_only_after_its_free_event,
    stream_alloc::stream_alloc_synchronous_new_buffer_after_a_stream_ordered_free,
    stream_alloc::stream_alloc_work_on_other_streams_keeps_the_buffer_alive,
    stream_alloc::stream_alloc_ipc_export_of_a_stream_ordered_buffer,
    stream_alloc::stream_alloc_out_of_memory_waits_for_pending_frees,
    stream_alloc::stream_alloc_bad_streams_are_invalid_argument,
    stream_alloc::stream_alloc_stream_of_another_device_is_invalid_argument,
    // copies
    copies::copy_from_host_then_copy_to_host_round_trips,
    copies::copy_to_host_into_caller_slice_round_trips,
    copies::copy_from_device_same_context_copies,
    copies::buffer_from_data_of_host_slice_copies,
    copies::buffer_from_data_of_host_buffer_copies,
    copies::buffer_from_data_of_device_buffer_copies,
    copies::reader_read_copies_to_host,
    copies::writer_unbuffered_write_copies_to_device,
    copies::writer_buffered_write_copies_to_device,
    copies::peer_copy_between_devices_0_and_1,
    copies::peer_copy_large_between_devices_both_directions,
    copies::buffer_from_data_of_other_device_buffer_copies,
    copies::copy_from_host_at_position_writes_only_there,
    copies::copy_to_host_at_position_reads_that_range,
    copies::copy_from_device_prefix_at_position_writes_only_there,
    copies::copy_from_device_within_one_allocation_overlapping_is_memmove,
    copies::copy_from_host_batch_lands_every_part_in_place,
    // ranges
    ranges::copy_to_host_position_past_size_is_out_of_range,
    ranges::copy_to_host_position_equal_to_size_copies_nothing,
    ranges::copy_to_host_position_plus_nbytes_past_size_is_out_of_range,
    ranges::copy_to_host_into_nbytes_over_destination_is_out_of_range,
    ranges::copy_to_host_into_past_device_end_is_out_of_range,
    ranges::copy_to_host_into_default_copies_what_fits,
    ranges::copy_from_host_source_too_short_is_source_too_short,
    ranges::copy_from_host_destination_too_short_is_out_of_range,
    ranges::copy_from_device_source_too_short_is_source_too_short,
    ranges::copy_from_device_destination_too_short_is_out_of_range,
    ranges::slice_past_end_is_out_of_range_not_clamped,
    ranges::usize_max_positions_and_lengths_are_errors_not_overflows,
    ranges::usize_max_in_reader_and_writer_is_an_error_not_an_overflow,
    ranges::refused_operations_change_nothing,
    ranges::error_messages_name_the_operation,
    ranges::copy_from_host_batch_out_of_range_or_overlapping_copies_nothing,
    // slices
    slices::slice_aliases_parent,
    slices::parent_writes_show_in_slice,
    slices::slice_of_slice_aliases_root,
    slices::slice_parent_returns_the_parent,
    slices::slice_chain_holds_the_root_not_the_chain,
    slices::slice_keeps_memory_alive_after_parent_drop,
    slices::zero_length_slices_are_allowed_up_to_size,
    // context
    context::num_devices_is_at_least_one,
    context::context_of_same_device_is_the_same_context,
    context::contexts_of_different_devices_differ,
    context::device_number_is_right_on_every_context,
    context::buffer_context_device_number_is_its_device,
    context::invalid_device_number_is_invalid_device,
    context::bytes_allocated_counts_owning_allocations_until_dropped,
    context::bytes_allocated_is_shared_by_context_clones,
    context::bytes_allocated_returns_to_start_after_every_kind_of_buffer,
    context::new_buffer_beyond_device_memory_is_out_of_memory,
    context::new_buffer_of_zero_bytes_has_address_zero,
    context::synchronize_succeeds,
    context::shared_context_over_primary_handle_has_its_own_counter,
    context::shared_context_memory_is_given_back_before_the_primary_is_released,
    context::buffer_from_data_copies_the_source,
    context::buffer_from_object_is_a_view,
    context::buffer_from_object_keeps_the_object_alive,
    context::buffer_from_object_of_other_device_buffer_is_invalid_argument,
    context::buffer_from_object_raw_memory_past_allocation_is_invalid_address,
    context::foreign_buffer_is_a_view,
    context::foreign_buffer_accepts_pinned_host_address,
    context::foreign_buffer_keeps_its_owner_alive,
    context::foreign_buffer_zero_zero_is_empty,
    context::foreign_buffer_past_allocation_is_invalid_address,
    context::foreign_buffer_of_other_device_memory_is_invalid_address,
    // host
    host::new_host_buffer_is_zeroed,
    host::new_host_buffer_of_zero_bytes_is_empty,
    host::new_host_buffer_is_not_counted_in_bytes_allocated,
    host::host_buffer_device_address_is_usable_for_copies,
    host::host_buffer_is_portable_to_other_devices,
    host::get_device_address_of_device_address_is_itself,
    host::get_device_address_of_pageable_memory_is_invalid_address,
    // It checks the addresses of a freed device buffer and of freed pinned host memory,
    // which another case's allocation may be handed at once (H200: the pinned pointer, 1
    // of 8 runs).
    host::get_device_address_of_freed_buffer_is_invalid_address.exclusive(),
    // reader
    reader::reader_sequence_of_reads_and_read_buffers,
    reader::reader_read_buffer_is_zero_copy,
    reader::reader_seek_to_size_then_read_returns_zero,
    reader::reader_read_is_short_at_the_end,
    reader::reader_seek_from_end_and_current,
    reader::reader_seek_past_size_is_out_of_range,
    reader::reader_seek_before_start_is_an_error,
    reader::reader_read_at_does_not_move,
    reader::reader_read_at_past_size_is_out_of_range,
    reader::closed_reader_is_closed,
    // files
    files::file_ranges_land_on_the_device_and_back,
    files::file_range_past_the_end_is_a_file_error,
    // writer
    writer::writer_is_unbuffered_by_default,
    writer::writer_buffered_small_write_is_staged,
    writer::writer_buffered_chunk_of_staging_size_goes_straight_through,
    writer::writer_buffered_write_filling_staging_flushes_then_writes,
    writer::writer_write_at_with_staged_bytes_lands_in_place,
    writer::writer_seek_to_size_is_allowed,
    writer::writer_seek_past_size_is_out_of_range,
    writer::writer_write_past_end_writes_nothing,
    writer::writer_flush_writes_staged_bytes,
    writer::writer_seek_flushes_staged_bytes,
    writer::writer_close_flushes_staged_bytes,
    writer::writer_drop_flushes_staged_bytes,
    writer::writer_set_buffer_size_flushes_staged_bytes,
    writer::writer_into_inner_flushes_staged_bytes,
    writer::writer_after_close_is_closed,
    // ipc
    ipc::ipc_handle_bytes_round_trip,
    ipc::ipc_handle_serde_round_trip,
    ipc::ipc_handle_names_backend_device_size_and_offset,
    ipc::ipc_truncated_handle_is_invalid_ipc_handle,
    ipc::ipc_oversized_handle_is_invalid_ipc_handle,
    ipc::ipc_bit_flipped_handle_is_invalid_ipc_handle,
    ipc::ipc_handle_of_other_backend_is_invalid_ipc_handle,
    ipc::ipc_zero_size_export_is_8_bytes_and_opens_empty,
    ipc::ipc_open_in_exporting_process_is_a_view_of_the_allocation,
    ipc::ipc_open_of_exported_slice_is_exactly_the_slice,
    ipc::ipc_open_twice_in_one_context_shares_the_memory,
    ipc::ipc_open_after_exporter_dropped_is_invalid_ipc_handle,
    ipc::ipc_export_keeps_memory_alive_while_a_clone_lives,
    ipc::ipc_export_of_pinned_host_view_is_unsupported,
    ipc::ipc_open_in_child_process_whole_buffer,
    ipc::ipc_open_in_child_process_slice_at_offset,
    ipc::ipc_open_in_child_process_on_other_device,
    ipc::ipc_handle_grants_its_whole_allocation_and_an_exclusive_one_no_more,
    // allocator
    //
    // It frees a block and checks that its address is refused: another case may be handed
    // the block at once (on the H200, 2026-12-03, the address then belonged to another
    // case's live buffer).
    allocator::cached_block_is_invalid_address_through_every_context.exclusive(),
    allocator::cached_block_is_bounded_by_its_request,
    allocator::cached_block_exported_opens_at_its_offset_in_a_child,
    // It looks for a free block in its exported buffer's segment: other cases may have
    // taken them all (H200, 2 of 5 runs in parallel).
    allocator::cached_block_exported_is_never_reused_while_an_importer_reads.exclusive(),
    // model-based (proptest state machines)
    model::buffer_semantics_match_vec_model,
    model::reader_writer_match_cursor_model,
    // reliability: hostile input
    reliability_inputs::invalid_device_number_everywhere_is_invalid_device,
    reliability_inputs::shared_context_of_null_handle_is_invalid_argument,
    reliability_inputs::shared_context_of_other_device_handle_is_invalid_argument,
    reliability_inputs::new_host_buffer_of_impossible_size_is_out_of_memory,
    reliability_inputs::writer_set_buffer_size_impossible_is_out_of_memory_and_keeps_writer,
    reliability_inputs::get_device_address_of_unmapped_addresses_is_invalid_address,
    //
    // A freed address must stay freed while the next four look: the driver may hand it to
    // a case running beside them (the pageable ones: seen once on the H200 with the cache
    // off; the pinned ones: another case's pinned allocation may be handed the freed
    // memory at once, as for `get_device_address_of_freed_buffer_is_invalid_address`).
    reliability_inputs::foreign_buffer_of_freed_pageable_or_unmapped_memory_is_invalid_address.exclusive(),
    reliability_inputs::foreign_buffer_of_freed_pinned_memory_is_invalid_address.exclusive(),
    reliability_inputs::copy_through_a_view_of_freed_pinned_memory_is_invalid_address.exclusive(),
    reliability_inputs::buffer_from_object_of_freed_pageable_or_unmapped_memory_is_invalid_address.exclusive(),
    reliability_inputs::buffer_of_another_backend_instance_is_refused_or_shared_by_kind,
    reliability_inputs::buffers_of_5000_backend_instances_never_share_an_address,
    reliability_inputs::ipc_to_pyarrow_bytes_refuses_offsets_and_simulator_handles,
    reliability_inputs::ipc_forged_handle_ranges_are_invalid_ipc_handle,
    reliability_inputs::reader_and_writer_over_an_empty_buffer_refuse_all_but_nothing,
    reliability_inputs::writer_into_inner_after_close_gives_the_buffer_back,
    reliability_inputs::buffer_outlives_its_backend_and_context_handles,
    // reliability: IPC handle bytes fuzzed (bounded proptest)
    reliability_ipc_fuzz::ipc_handle_bytes_fuzzed_are_typed_errors,
    // reliability: process faults around IPC
    reliability_process::process_importer_crash_while_mapped_leaves_exporter_intact,
    reliability_process::process_exporter_exit_while_mapped_keeps_importer_mapping,
    reliability_process::ipc_mapping_shared_by_two_contexts_is_closed_before_the_primary_is_released,
    reliability_process::process_handle_of_exited_exporter_is_invalid_ipc_handle,
    reliability_process::process_handle_of_exited_exporter_after_pid_reuse_is_invalid_ipc_handle,
    reliability_process::process_importer_killed_mid_copy_leaves_exporter_consistent,
    // reliability: load
    reliability_load::stress_mixed_operations_on_many_threads_lose_nothing,
    reliability_load::device_filled_with_buffers_gives_out_of_memory_and_recovers,
];

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    #[test]
    fn case_names_are_unique() {
        let mut seen = HashSet::new();
        for case in super::ALL {
            assert!(seen.insert(case.name), "case {} is listed twice", case.name);
        }
    }
}
