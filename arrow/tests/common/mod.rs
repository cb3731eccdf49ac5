//! The Arrow cases, run on every backend by `tests/sim.rs` and `tests/cuda.rs` through
//! cudabuf-conformance's harness. Each case is a plain function named after the behaviour
//! it checks; errors are checked by kind.

mod c_consumer;
mod c_device;
mod c_device_edit;
mod c_device_hostile;
mod corrupt;
mod data;
mod files;
mod files_corrupt;
mod on_stream;
mod ordering;
mod parallel;
#[cfg(feature = "parquet")]
mod parquet;
#[cfg(feature = "parquet")]
mod parquet_hostile;
mod roundtrip;
mod slices;
mod stream;
mod sync_event;

use cudabuf_arrow::{DeviceArray, DeviceRecordBatch};
use cudabuf_conformance::{Case, CaseFn, Fixture};
use cudabuf_core::{Context, DeviceBuffer};

/// Builds the list of [`Case`]s from `module::function` paths (each runs beside the
/// others: none needs to run alone).
macro_rules! cases {
    ($($module:ident :: $case:ident),* $(,)?) => {
        &[$(Case::new(stringify!($case), $module::$case as CaseFn)),*]
    };
}

/// Every Arrow case.
pub(crate) const ARROW_CASES: &[Case] = cases![
    roundtrip::int_column_bytes_match_arrow_rs_and_round_trip,
    roundtrip::float_column_bytes_match_arrow_rs_and_round_trip,
    roundtrip::bool_column_bytes_match_arrow_rs_and_round_trip,
    roundtrip::utf8_column_bytes_match_arrow_rs_and_round_trip,
    roundtrip::list_column_bytes_match_arrow_rs_and_round_trip,
    roundtrip::struct_column_bytes_match_arrow_rs_and_round_trip,
    roundtrip::many_types_bytes_match_arrow_rs_and_round_trip,
    roundtrip::zero_rows_bytes_match_arrow_rs_and_round_trip,
    roundtrip::zero_columns_bytes_match_arrow_rs_and_round_trip,
    roundtrip::multi_mib_batch_bytes_match_arrow_rs_and_round_trip,
    roundtrip::sliced_batches_serialize_like_arrow_rs_and_round_trip,
    roundtrip::dictionary_column_in_one_message_is_unsupported,
    roundtrip::serializer_reuses_its_pinned_staging_buffer,
    roundtrip::serializer_without_staging_writes_the_same_bytes,
    roundtrip::to_host_lands_in_pooled_pinned_blocks_never_shared_by_live_batches,
    roundtrip::column_buffers_are_zero_copy_slices_of_the_body,
    roundtrip::read_record_batch_allocates_no_device_memory,
    roundtrip::read_message_from_buffer_keeps_body_on_device,
    roundtrip::read_message_from_reader_advances_past_each_message,
    roundtrip::read_message_at_end_of_stream_is_invalid_data,
    roundtrip::read_message_pre_0_15_framing_is_read,
    roundtrip::read_message_on_closed_reader_is_closed,
    roundtrip::read_record_batch_of_schema_message_is_invalid_data,
    roundtrip::read_record_batch_with_wrong_schema_is_invalid_data,
    roundtrip::dictionary_column_in_one_message_is_invalid_argument,
    roundtrip::bytes_allocated_returns_to_start_after_drops,
    slices::to_host_slice_of_fixed_width_columns_equals_arrow_rs_slice,
    slices::to_host_slice_of_binary_and_string_columns_equals_arrow_rs_slice,
    slices::to_host_slice_of_nested_columns_copies_the_batch_and_slices_it,
    slices::to_host_slice_of_corrupt_offsets_is_invalid_data,
    slices::to_host_slice_of_no_rows_is_empty_even_without_offsets,
    slices::to_host_slice_of_columns_with_an_offset_equals_arrow_rs_slice,
    slices::to_host_slice_outside_the_batch_is_invalid_argument,
    stream::stream_bytes_match_arrow_rs_stream_writer,
    stream::stream_with_dictionaries_reads_back_through_buffer_reader,
    stream::stream_dictionaries_stay_on_device_and_are_shared,
    stream::stream_dictionary_replacement_applies_to_later_batches,
    stream::stream_delta_dictionary_is_unsupported,
    stream::stream_of_arrow_rs_bytes_copied_to_device_reads_back,
    stream::stream_writer_rejects_batch_of_other_schema,
    stream::empty_stream_has_schema_and_no_batches,
    stream::stream_reader_stops_after_an_error,
    c_device::c_device_batch_export_import_round_trips_and_releases_once,
    c_device::c_device_export_dropped_without_import_releases_once,
    c_device::c_device_export_released_in_place_by_a_consumer_is_not_released_again,
    c_device::c_device_export_moved_by_a_c_consumer_is_released_once,
    c_device::c_device_export_not_taken_by_the_consumer_is_released_with_its_box,
    c_device::c_device_export_written_into_a_consumer_struct_is_released_once,
    c_device::c_device_moved_out_struct_is_released_and_dropping_it_does_nothing,
    c_device::c_device_children_are_released_with_their_parent_unless_moved,
    c_device::c_device_export_points_at_the_device_buffers,
    c_device::c_device_column_export_import_round_trips,
    c_device::c_device_import_keeps_producer_alive_until_last_buffer_drops,
    c_device::c_device_import_of_other_device_type_is_refused_and_released,
    c_device::c_device_import_of_null_or_released_array_is_invalid_argument,
    c_device::c_device_import_of_released_or_null_child_is_invalid_data,
    c_device::c_device_import_computes_unknown_null_count,
    c_device::c_device_import_with_wrong_buffer_count_is_invalid_data,
    c_device::c_device_schema_export_round_trips,
    c_device::c_device_view_types_are_unsupported,
    c_device_hostile::c_device_import_of_lying_numbers_and_pointers_is_a_typed_error,
    c_device_hostile::c_device_import_as_every_other_type_is_a_typed_error,
    sync_event::c_device_export_on_a_stream_orders_the_importers_stream_after_the_producer,
    sync_event::c_device_import_without_a_stream_waits_for_the_event_on_the_host,
    sync_event::c_device_null_sync_event_is_no_wait,
    sync_event::c_device_sync_event_lives_until_the_release,
    sync_event::c_device_sync_event_is_destroyed_at_release_and_bad_handles_are_refused,
    sync_event::c_device_bad_sync_event_pointers_are_invalid_data,
    sync_event::c_device_streams_of_another_device_are_invalid_argument,
    on_stream::serialize_on_a_stream_writes_arrow_rs_bytes_and_round_trips,
    on_stream::from_host_on_a_stream_reads_nothing_back_and_round_trips,
    on_stream::serialize_stream_on_a_stream_writes_arrow_rs_bytes_and_round_trips,
    on_stream::read_after_serialize_on_a_stream_follows_the_streams_rules,
    on_stream::to_host_on_a_stream_lands_in_pooled_pinned_blocks,
    on_stream::serialize_on_a_stream_of_another_device_is_invalid_argument,
    corrupt::every_truncation_of_a_message_is_invalid_data,
    corrupt::every_truncation_of_a_stream_is_an_error_never_a_panic,
    corrupt::bit_flips_in_metadata_length_are_invalid_data,
    corrupt::bit_flips_in_body_length_are_invalid_data,
    corrupt::bit_flips_in_flatbuffer_metadata_never_panic,
    corrupt::buffer_descriptor_outside_body_is_invalid_data,
    corrupt::trailing_bytes_after_the_message_are_invalid_data,
    corrupt::compressed_body_is_unsupported,
    corrupt::corrupt_offsets_on_device_are_invalid_data_on_to_host,
];

/// The file cases: Arrow IPC files and stream files on disk.
pub(crate) const FILE_CASES: &[Case] = cases![
    files::ipc_file_round_trips_every_schema_and_codec_like_arrow_rs,
    files::ipc_file_batches_are_read_in_any_order,
    files::ipc_file_projection_lands_only_the_projected_columns,
    files::ipc_file_open_allocates_nothing_and_drops_give_everything_back,
    files::ipc_file_from_an_open_file_reads_the_same,
    files::ipc_file_writer_output_reads_back_with_arrow_rs,
    files::ipc_stream_file_reads_back_like_arrow_rs,
    files_corrupt::every_truncation_of_an_ipc_file_is_invalid_data,
    files_corrupt::bad_magic_and_footer_lengths_are_invalid_data,
    files_corrupt::a_schema_arrow_rs_cannot_build_arrays_of_is_invalid_data,
    files_corrupt::blocks_outside_the_file_or_overlapping_are_invalid_data,
    files_corrupt::bit_flips_anywhere_in_an_ipc_file_never_panic,
    files_corrupt::compressed_buffers_whose_lengths_lie_are_invalid_data,
    files_corrupt::missing_files_and_directories_are_file_errors,
    files_corrupt::fields_of_different_types_sharing_a_dictionary_id_are_invalid_data,
    parallel::compressed_ipc_files_read_alike_with_1_2_and_8_threads,
    parallel::a_corrupt_body_in_the_middle_is_invalid_data_naming_the_file_and_byte,
    parallel::a_compressed_file_that_shrinks_while_read_is_a_file_error,
    parallel::empty_files_and_zero_row_batches_read_with_every_thread_count,
    parallel::files_pyarrow_wrote_read_alike_with_every_thread_count,
];

/// The Parquet cases (feature `parquet`).
#[cfg(feature = "parquet")]
pub(crate) const PARQUET_CASES: &[Case] = cases![
    parquet::parquet_round_trips_every_schema_and_codec_like_arrow_rs,
    parquet::parquet_projection_reads_the_named_columns_in_order,
    parquet::corrupt_parquet_files_are_invalid_data_never_a_panic,
    parquet::parquet_missing_files_and_directories_are_file_errors,
    parquet::parquet_file_the_decoder_panicked_on_is_invalid_data,
    parquet_hostile::parquet_row_groups_give_exactly_the_rows_their_footer_declares,
    parquet_hostile::parquet_row_counts_summing_past_usize_are_invalid_data,
    parquet_hostile::parquet_schemas_nested_too_deep_or_with_absent_children_are_invalid_data,
    parquet_hostile::parquet_pages_beyond_the_decompression_limit_are_invalid_data,
    parquet_hostile::parquet_page_headers_that_lie_about_their_contents_are_invalid_data,
    parquet_hostile::parquet_fields_of_another_thrift_type_than_the_crate_reads_are_invalid_data,
    parquet_hostile::parquet_files_of_64_nested_lists_read_and_65_are_invalid_data,
    parquet_hostile::parquet_skipped_boolean_collections_are_invalid_data_at_once,
    parquet_hostile::parquet_files_declaring_other_rows_than_their_row_groups_are_invalid_data,
    parallel::parquet_row_groups_decoded_in_parallel_arrive_in_file_order,
    parallel::a_corrupt_row_group_in_the_middle_ends_the_file_there,
    parallel::parquet_files_of_zero_rows_or_one_row_group_read_with_every_thread_count,
];

/// Every case of this build: [`ARROW_CASES`], [`FILE_CASES`] and, with the `parquet`
/// feature, [`PARQUET_CASES`].
pub(crate) fn all_cases() -> Vec<Case> {
    let mut cases = ARROW_CASES.to_vec();
    cases.extend_from_slice(FILE_CASES);
    #[cfg(feature = "parquet")]
    cases.extend_from_slice(PARQUET_CASES);
    cases
}

/// A fresh backend's device 0 context.
pub(crate) fn context(f: &Fixture) -> Context {
    f.backend().context(0).expect("context 0")
}

/// Whether `inner` lies within `outer` (same context, address range inside).
pub(crate) fn within(inner: &DeviceBuffer, outer: &DeviceBuffer) -> bool {
    inner.context().same_as(outer.context())
        && inner.address() >= outer.address()
        && inner.address() + inner.size() as u64 <= outer.address() + outer.size() as u64
}

/// Every device buffer of every column.
pub(crate) fn all_buffers(batch: &DeviceRecordBatch) -> Vec<&DeviceBuffer> {
    batch
        .columns()
        .iter()
        .flat_map(DeviceArray::device_buffers)
        .collect()
}
