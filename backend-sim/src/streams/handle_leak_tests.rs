//! No stream or event outlives its owner (the hostile review of streams): whatever a user
//! does with `cudabuf_core`'s streams, events and transfers (clones across threads,
//! transfers outliving their stream, forgotten transfers taken back, errors), once
//! everything is dropped the instance holds no created stream and no event.

use std::thread;

use cudabuf_core::{Backend, StreamFlags};

use crate::{RaceMode, Schedule, SimBackend, SimConfig};

#[test]
fn dropped_streams_events_and_transfers_leave_no_handle_behind() {
    for schedule in [Schedule::Deterministic, Schedule::Threaded] {
        let sim = SimBackend::with_config(SimConfig {
            seed: Some(8),
            schedule: Some(schedule),
            races: Some(RaceMode::Fail),
            ..SimConfig::default()
        })
        .unwrap();
        let ctx = Backend::new(sim.clone()).context(0).unwrap();
        let streams_before = sim.lock_state().streams.streams.len();
        let rounds = if cfg!(miri) { 2 } else { 24 };
        for i in 0..rounds {
            let stream = ctx
                .new_stream_with(StreamFlags {
                    non_blocking: i % 2 == 0,
                    priority: -(i % 6),
                })
                .unwrap();
            let buf = ctx.new_buffer(256).unwrap();
            stream.copy_from_slice(&buf, &[i as u8; 256]).unwrap();
            let timing = ctx.new_timing_event().unwrap();
            timing.record(&stream).unwrap();
            let transfer = stream
                .copy_to_host(&buf, ctx.new_host_buffer(256).unwrap())
                .unwrap();
            let other = stream.clone();
            let worker = thread::spawn(move || {
                let ready = other.record_event().unwrap();
                other.wait_event(&ready).unwrap();
                other.query().unwrap();
            });
            worker.join().unwrap();
            // A failed operation (too big) takes no handle with it.
            assert!(stream.copy_from_slice(&buf, &[0; 257]).is_err());
            if i % 3 == 0 {
                drop(stream); // the transfer outlives its stream
            }
            assert_eq!(&transfer.wait().unwrap()[..], &[i as u8; 256][..]);
        }
        ctx.synchronize().unwrap();
        let state = sim.lock_state();
        assert!(
            state.streams.events.is_empty(),
            "{schedule:?}: {} events left",
            state.streams.events.len()
        );
        assert_eq!(state.streams.streams.len(), streams_before, "{schedule:?}");
        drop(state);
        drop(ctx);
        assert!(sim.leak_report().is_empty(), "{:?}", sim.leak_report());
        assert!(sim.race_report().is_empty(), "{:?}", sim.race_report());
    }
}
