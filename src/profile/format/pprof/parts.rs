//! Where the parts of a pprof message go as [`super::build`] makes them:
//! into a `proto::Profile` in memory, or encoded straight to a writer.
//!
//! A protobuf message's encoding is the concatenation of its fields', in
//! any order, a repeated field once per element (the protobuf encoding
//! spec, "Order of fields" and "Repeated fields"): so each mapping,
//! location, function and sample can be written as soon as it is built and
//! dropped, and the header fields with the string table last.

use std::io::Write;

use anyhow::{Context, Result};
use prost::Message;

use super::proto;

/// Field numbers of `perftools.profiles.Profile` (`proto/profile.proto`).
const SAMPLE: u32 = 2;
const MAPPING: u32 = 3;
const LOCATION: u32 = 4;
const FUNCTION: u32 = 5;

/// Bytes [`Stream`] gathers before writing them out.
const STREAM_BUFFER_BYTES: usize = 64 << 10;

/// Receives a pprof message's parts, in the order [`super::build`] makes
/// them.
pub(super) trait Parts {
    /// One `Profile.mapping`.
    fn mapping(&mut self, mapping: proto::Mapping) -> Result<()>;
    /// One `Profile.location`.
    fn location(&mut self, location: proto::Location) -> Result<()>;
    /// One `Profile.function`.
    fn function(&mut self, function: proto::Function) -> Result<()>;
    /// One `Profile.sample`.
    fn sample(&mut self, sample: proto::Sample) -> Result<()>;
    /// Every other field (sample types, period, times, comments, the
    /// string table), last; its repeated message fields above are empty.
    fn rest(&mut self, rest: proto::Profile) -> Result<()>;
}

/// Collects the parts into one message.
impl Parts for proto::Profile {
    fn mapping(&mut self, mapping: proto::Mapping) -> Result<()> {
        self.mapping.push(mapping);
        Ok(())
    }

    fn location(&mut self, location: proto::Location) -> Result<()> {
        self.location.push(location);
        Ok(())
    }

    fn function(&mut self, function: proto::Function) -> Result<()> {
        self.function.push(function);
        Ok(())
    }

    fn sample(&mut self, sample: proto::Sample) -> Result<()> {
        self.sample.push(sample);
        Ok(())
    }

    fn rest(&mut self, rest: proto::Profile) -> Result<()> {
        let proto::Profile {
            sample_type,
            string_table,
            drop_frames,
            keep_frames,
            time_nanos,
            duration_nanos,
            period_type,
            period,
            comment,
            default_sample_type,
            ..
        } = rest;
        self.sample_type = sample_type;
        self.string_table = string_table;
        self.drop_frames = drop_frames;
        self.keep_frames = keep_frames;
        self.time_nanos = time_nanos;
        self.duration_nanos = duration_nanos;
        self.period_type = period_type;
        self.period = period;
        self.comment = comment;
        self.default_sample_type = default_sample_type;
        Ok(())
    }
}

/// Encodes each part as it comes and writes the bytes to a writer, in
/// pieces of about [`STREAM_BUFFER_BYTES`].
pub(super) struct Stream<'w> {
    out: &'w mut dyn Write,
    buffer: Vec<u8>,
}

impl<'w> Stream<'w> {
    pub(super) fn new(out: &'w mut dyn Write) -> Self {
        Stream {
            out,
            buffer: Vec::with_capacity(STREAM_BUFFER_BYTES),
        }
    }

    fn field(&mut self, tag: u32, message: &impl Message) -> Result<()> {
        prost::encoding::message::encode(tag, message, &mut self.buffer);
        if self.buffer.len() >= STREAM_BUFFER_BYTES {
            self.flush()?;
        }
        Ok(())
    }

    /// Write out what is gathered.
    pub(super) fn flush(&mut self) -> Result<()> {
        self.out
            .write_all(&self.buffer)
            .context("writing the pprof profile")?;
        self.buffer.clear();
        Ok(())
    }
}

impl Parts for Stream<'_> {
    fn mapping(&mut self, mapping: proto::Mapping) -> Result<()> {
        self.field(MAPPING, &mapping)
    }

    fn location(&mut self, location: proto::Location) -> Result<()> {
        self.field(LOCATION, &location)
    }

    fn function(&mut self, function: proto::Function) -> Result<()> {
        self.field(FUNCTION, &function)
    }

    fn sample(&mut self, sample: proto::Sample) -> Result<()> {
        self.field(SAMPLE, &sample)
    }

    fn rest(&mut self, rest: proto::Profile) -> Result<()> {
        // A message's own encoding, without a length prefix: its fields.
        rest.encode(&mut self.buffer)
            .context("encoding the pprof header")?;
        Ok(())
    }
}
