//! TensorBoard event files: a run writes every scalar of `metrics.jsonl` (and its decoded
//! samples, as text) to `tb/events.out.tfevents.*` as it goes, so `tensorboard --logdir
//! runs` shows a live run beside TRL's, verl's or OpenRLHF's.
//!
//! The format is TensorFlow's record file: each record is its length (u64, little-endian),
//! the masked CRC-32C of those 8 bytes, the bytes of one protobuf `Event`, and their masked
//! CRC-32C. The three messages written here (`Event`, `Summary`, `SessionLog`, with the
//! text plugin's `TensorProto`) are declared below with the field numbers of TensorFlow's
//! `event.proto` / `summary.proto` and encoded by `prost`; the checksum is `crc`'s
//! Castagnoli CRC (ARCHITECTURE.md says why not a TensorBoard crate).

use prost::Message;
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

/// One event of the file (TensorFlow's `Event`, the fields written here).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Event {
    /// Seconds since the Unix epoch.
    #[prost(double, tag = "1")]
    pub wall_time: f64,
    /// The training step.
    #[prost(int64, tag = "2")]
    pub step: i64,
    /// `brain.Event:2` in a file's first event.
    #[prost(string, optional, tag = "3")]
    pub file_version: Option<String>,
    /// Values at `step`.
    #[prost(message, optional, tag = "5")]
    pub summary: Option<Summary>,
    /// A resumed run's restart (TensorBoard drops what the old file logged after it).
    #[prost(message, optional, tag = "7")]
    pub session_log: Option<SessionLog>,
}

/// TensorFlow's `Summary`: the values of one step.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Summary {
    /// The values.
    #[prost(message, repeated, tag = "1")]
    pub value: Vec<SummaryValue>,
}

/// TensorFlow's `Summary.Value`: a scalar (`simple_value`) or a plugin's tensor.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SummaryValue {
    /// The series' name (`eval/acc_id`).
    #[prost(string, tag = "1")]
    pub tag: String,
    /// A scalar.
    #[prost(float, optional, tag = "2")]
    pub simple_value: Option<f32>,
    /// A text (a string tensor).
    #[prost(message, optional, tag = "8")]
    pub tensor: Option<TensorProto>,
    /// Which plugin reads `tensor`.
    #[prost(message, optional, tag = "9")]
    pub metadata: Option<SummaryMetadata>,
}

/// TensorFlow's `SummaryMetadata` (the plugin's name only).
#[derive(Clone, PartialEq, prost::Message)]
pub struct SummaryMetadata {
    /// The plugin.
    #[prost(message, optional, tag = "1")]
    pub plugin_data: Option<PluginData>,
}

/// TensorFlow's `SummaryMetadata.PluginData`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PluginData {
    /// `text` for a text summary.
    #[prost(string, tag = "1")]
    pub plugin_name: String,
}

/// TensorFlow's `TensorProto`, as a scalar string (a text summary's content).
#[derive(Clone, PartialEq, prost::Message)]
pub struct TensorProto {
    /// `DT_STRING` = 7.
    #[prost(int32, tag = "1")]
    pub dtype: i32,
    /// An empty shape: a scalar.
    #[prost(message, optional, tag = "2")]
    pub tensor_shape: Option<TensorShape>,
    /// The string (markdown, for the text plugin).
    #[prost(bytes = "vec", repeated, tag = "8")]
    pub string_val: Vec<Vec<u8>>,
}

/// TensorFlow's `TensorShapeProto` with no dimensions.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TensorShape {}

/// TensorFlow's `SessionLog` (its status only).
#[derive(Clone, PartialEq, prost::Message)]
pub struct SessionLog {
    /// `START` = 1.
    #[prost(int32, tag = "1")]
    pub status: i32,
}

const DT_STRING: i32 = 7;
const SESSION_START: i32 = 1;
const CRC32C: crc::Crc<u32> = crc::Crc::<u32>::new(&crc::CRC_32_ISCSI);

/// The checksum a record carries: CRC-32C, rotated and offset (TensorFlow's mask).
fn masked_crc(bytes: &[u8]) -> u32 {
    let c = CRC32C.checksum(bytes);
    (c.rotate_right(15)).wrapping_add(0xa282_ead8)
}

/// One record around `data`.
fn record(data: &[u8]) -> Vec<u8> {
    let len = (data.len() as u64).to_le_bytes();
    let mut out = Vec::with_capacity(data.len() + 16);
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc(&len).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc(data).to_le_bytes());
    out
}

fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// An event file of one run directory, appended to event by event (each write opens,
/// appends and closes it, so a reader sees every step as soon as it is written and a
/// killed run loses nothing written).
#[derive(Debug, Clone)]
pub struct EventFile {
    path: PathBuf,
}

impl EventFile {
    /// A new event file in `dir` (created), named as TensorBoard expects
    /// (`events.out.tfevents.<seconds>.rlany.<process>`), starting with its version event.
    pub fn create(dir: &Path) -> std::io::Result<Self> {
        fs::create_dir_all(dir)?;
        let secs = now() as u64;
        let path = dir.join(format!(
            "events.out.tfevents.{secs}.rlany.{}",
            std::process::id()
        ));
        let file = Self { path };
        if !file.path.exists() {
            file.write(&Event {
                wall_time: now(),
                file_version: Some("brain.Event:2".into()),
                ..Event::default()
            })?;
        }
        Ok(file)
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn write(&self, event: &Event) -> std::io::Result<()> {
        let mut f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)?;
        f.write_all(&record(&event.encode_to_vec()))?;
        f.flush()
    }

    fn summary(&self, step: usize, value: Vec<SummaryValue>) -> std::io::Result<()> {
        self.write(&Event {
            wall_time: now(),
            step: step as i64,
            summary: Some(Summary { value }),
            ..Event::default()
        })
    }

    /// The scalars `(tag, value)` of `step`, as one event (non-finite values are skipped).
    pub fn scalars<'a>(
        &self,
        step: usize,
        values: impl IntoIterator<Item = (&'a str, f64)>,
    ) -> std::io::Result<()> {
        let value: Vec<SummaryValue> = values
            .into_iter()
            .filter(|(_, v)| v.is_finite())
            .map(|(tag, v)| SummaryValue {
                tag: tag.to_string(),
                simple_value: Some(v as f32),
                ..SummaryValue::default()
            })
            .collect();
        if value.is_empty() {
            return Ok(());
        }
        self.summary(step, value)
    }

    /// A text summary (markdown) under `tag` at `step`, for TensorBoard's text tab.
    pub fn text(&self, step: usize, tag: &str, markdown: &str) -> std::io::Result<()> {
        self.summary(
            step,
            vec![SummaryValue {
                tag: tag.to_string(),
                tensor: Some(TensorProto {
                    dtype: DT_STRING,
                    tensor_shape: Some(TensorShape {}),
                    string_val: vec![markdown.as_bytes().to_vec()],
                }),
                metadata: Some(SummaryMetadata {
                    plugin_data: Some(PluginData {
                        plugin_name: "text".into(),
                    }),
                }),
                ..SummaryValue::default()
            }],
        )
    }

    /// A restart at `step` (a resumed run continues there): TensorBoard then drops what an
    /// earlier file logged from `step` on, as the run's own `metrics.jsonl` does.
    pub fn restart(&self, step: usize) -> std::io::Result<()> {
        self.write(&Event {
            wall_time: now(),
            step: step as i64,
            session_log: Some(SessionLog {
                status: SESSION_START,
            }),
            ..Event::default()
        })
    }
}

/// Why an event file cannot be read back.
#[derive(Debug, thiserror::Error)]
pub enum EventFileError {
    /// The file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A record is cut short, fails its checksum or is not an `Event`.
    #[error("{path}: record at byte {offset}: {reason}")]
    Bad {
        /// The file.
        path: PathBuf,
        /// Where the record starts.
        offset: usize,
        /// What is wrong.
        reason: String,
    },
}

/// Every event of a file, each record's length and data checked against its checksums.
pub fn read_events(path: &Path) -> Result<Vec<Event>, EventFileError> {
    let bytes = fs::read(path).map_err(|source| EventFileError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let bad = |offset: usize, reason: &str| EventFileError::Bad {
        path: path.to_path_buf(),
        offset,
        reason: reason.to_string(),
    };
    let u32_at = |at: usize| -> Option<u32> {
        Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
    };
    let mut events = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let len_bytes = bytes.get(at..at + 8).ok_or_else(|| bad(at, "cut short"))?;
        if u32_at(at + 8) != Some(masked_crc(len_bytes)) {
            return Err(bad(at, "length checksum"));
        }
        let mut len8 = [0u8; 8];
        len8.copy_from_slice(len_bytes);
        let len = usize::try_from(u64::from_le_bytes(len8)).map_err(|_| bad(at, "length"))?;
        let data = bytes
            .get(at + 12..at + 12 + len)
            .ok_or_else(|| bad(at, "cut short"))?;
        if u32_at(at + 12 + len) != Some(masked_crc(data)) {
            return Err(bad(at, "data checksum"));
        }
        events.push(Event::decode(data).map_err(|e| bad(at, &e.to_string()))?);
        at += 16 + len;
    }
    Ok(events)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_checksum_is_tensorflows_masked_crc32c() {
        // CRC-32C of "123456789" is 0xE3069283 (its standard check value); masked:
        // rotate right by 15, then add 0xA282EAD8.
        assert_eq!(CRC32C.checksum(b"123456789"), 0xE306_9283);
        let want = 0xE306_9283u32.rotate_right(15).wrapping_add(0xA282_EAD8);
        assert_eq!(masked_crc(b"123456789"), want);
    }

    #[test]
    fn an_event_is_encoded_with_tensorflows_field_numbers() {
        // step 3 (field 2, varint) and one scalar: tag "a" (field 1 of the value), 0.5 as
        // float (field 2, fixed32), inside summary (field 5).
        let e = Event {
            wall_time: 0.0,
            step: 3,
            summary: Some(Summary {
                value: vec![SummaryValue {
                    tag: "a".into(),
                    simple_value: Some(0.5),
                    ..SummaryValue::default()
                }],
            }),
            ..Event::default()
        };
        let value = [0x0a, 0x01, b'a', 0x15, 0x00, 0x00, 0x00, 0x3f];
        let mut want = vec![0x10, 0x03, 0x2a, 0x0a, 0x0a, 0x08];
        want.extend_from_slice(&value);
        assert_eq!(e.encode_to_vec(), want);
    }

    #[test]
    fn events_read_back_and_a_damaged_record_is_an_error() {
        let dir = std::env::temp_dir().join(format!("rlany-tb-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let f = EventFile::create(&dir).expect("create");
        f.scalars(2, [("eval/acc_id", 0.25), ("loss", f64::NAN)])
            .expect("scalars");
        f.text(2, "samples/id", "**solved**").expect("text");
        f.restart(3).expect("restart");
        let events = read_events(f.path()).expect("read");
        assert_eq!(events.len(), 4);
        assert_eq!(events[0].file_version.as_deref(), Some("brain.Event:2"));
        let scalars = &events[1].summary.as_ref().expect("summary").value;
        assert_eq!(
            (events[1].step, scalars.len(), scalars[0].tag.as_str()),
            (2, 1, "eval/acc_id")
        );
        assert_eq!(scalars[0].simple_value, Some(0.25));
        let text = &events[2].summary.as_ref().expect("text").value[0];
        let tensor = text.tensor.as_ref().expect("tensor");
        assert_eq!(tensor.string_val, vec![b"**solved**".to_vec()]);
        assert_eq!(events[3].session_log.as_ref().map(|s| s.status), Some(1));
        // One flipped byte in the last record's data fails its checksum.
        let mut bytes = fs::read(f.path()).expect("bytes");
        let n = bytes.len();
        bytes[n - 6] ^= 1;
        fs::write(f.path(), bytes).expect("write");
        assert!(matches!(
            read_events(f.path()),
            Err(EventFileError::Bad { .. })
        ));
        let _ = fs::remove_dir_all(dir);
    }
}
