//! A record as written, before its fields are judged: what a generic
//! value would hide is kept as a fault of the record. A key given twice
//! (a generic map keeps the last value, silently) and a float a generic
//! value cannot hold (YAML's `.nan` and `.inf`, held as null, so the
//! field would read as absent) reject the record, naming the field.
//! What the records decode to is bounded by the file's size ([`Budget`]):
//! YAML aliases repeat a value without repeating its text.

use std::{cell::Cell, fmt};

use serde::{
    Deserialize, Deserializer,
    de::{IgnoredAny, MapAccess, SeqAccess, Visitor},
};
use serde_json::{Map, Number, Value};

use super::shown;

thread_local! {
    /// The bytes the records being decoded on this thread may still take
    /// (`None`: unbounded).
    static LEFT: Cell<Option<usize>> = const { Cell::new(None) };
}

/// Bounds what the records of one file decode to, while it lives: their
/// keys and strings, and a byte a record. Without aliases that is at most
/// the file's size; a file whose aliases make it more than twice that is
/// refused, before it can take the agent's memory.
pub(super) struct Budget;

impl Budget {
    /// A budget for a file of `len` bytes.
    pub(super) fn for_file(len: usize) -> Self {
        LEFT.set(Some(len.saturating_mul(2).saturating_add(4096)));
        Self
    }
}

impl Drop for Budget {
    fn drop(&mut self) {
        LEFT.set(None);
    }
}

/// Takes `n` bytes from the budget: an error once it is spent.
fn charge<E: serde::de::Error>(n: usize) -> Result<(), E> {
    match LEFT.get() {
        None => Ok(()),
        Some(left) if left >= n => {
            LEFT.set(Some(left - n));
            Ok(())
        }
        Some(_) => Err(E::custom(
            "the records decode to more than twice the file's size (a YAML alias repeated?)",
        )),
    }
}

/// A record: its value (a field given twice with its first value), and
/// the first fault found while reading it.
pub(super) struct Written {
    pub(super) value: Value,
    pub(super) fault: Option<String>,
}

impl<'de> Deserialize<'de> for Written {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        charge::<D::Error>(1)?;
        d.deserialize_any(RecordVisitor)
    }
}

/// A field's value, or why it is no value a field may have.
struct Field(Result<Value, String>);

impl<'de> Deserialize<'de> for Field {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(FieldVisitor).map(Self)
    }
}

struct RecordVisitor;

impl<'de> Visitor<'de> for RecordVisitor {
    type Value = Written;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a node record")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Self::Value, A::Error> {
        let mut fields = Map::new();
        let mut fault = None;
        while let Some(key) = access.next_key::<String>()? {
            charge::<A::Error>(key.len())?;
            let Field(value) = access.next_value()?;
            let found = match value {
                _ if fields.contains_key(&key) => {
                    Some(format!("field `{}` is given twice", shown(&key)))
                }
                Ok(v) => {
                    fields.insert(key, v);
                    None
                }
                Err(why) => Some(format!(
                    "field `{}`: expected a string, found {why}",
                    shown(&key)
                )),
            };
            fault = fault.or(found);
        }
        Ok(Written {
            value: Value::Object(fields),
            fault,
        })
    }

    // Anything else is a record of the wrong kind, judged as such by the
    // fields' rules: read whole, as a value.
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        FieldVisitor.visit_seq(seq).map(Written::of)
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
        FieldVisitor.visit_str(v).map(Written::of)
    }

    fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<Self::Value, E> {
        FieldVisitor.visit_bool(v).map(Written::of)
    }

    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Self::Value, E> {
        FieldVisitor.visit_i64(v).map(Written::of)
    }

    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Self::Value, E> {
        FieldVisitor.visit_u64(v).map(Written::of)
    }

    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Self::Value, E> {
        FieldVisitor.visit_f64(v).map(Written::of)
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
        Ok(Written::of(Ok(Value::Null)))
    }

    fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
        Ok(Written::of(Ok(Value::Null)))
    }
}

impl Written {
    /// A record that is no mapping, as a field's value would be read.
    fn of(field: Result<Value, String>) -> Self {
        match field {
            Ok(value) => Self { value, fault: None },
            Err(why) => Self {
                value: Value::Null,
                fault: Some(format!("expected a mapping of fields, found {why}")),
            },
        }
    }
}

struct FieldVisitor;

impl<'de> Visitor<'de> for FieldVisitor {
    type Value = Result<Value, String>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a field's value")
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
        charge::<E>(v.len())?;
        Ok(Ok(Value::String(v.to_owned())))
    }

    fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Self::Value, E> {
        charge::<E>(v.len())?;
        Ok(Ok(Value::String(v)))
    }

    fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<Self::Value, E> {
        Ok(Ok(Value::Bool(v)))
    }

    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Self::Value, E> {
        Ok(Ok(Value::Number(v.into())))
    }

    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Self::Value, E> {
        Ok(Ok(Value::Number(v.into())))
    }

    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Self::Value, E> {
        Ok(Number::from_f64(v)
            .map(Value::Number)
            .ok_or_else(|| format!("number `{v}`")))
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
        Ok(Ok(Value::Null))
    }

    fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
        Ok(Ok(Value::Null))
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }

    // A list or a mapping is no field's value: its items are skipped, and
    // the field's rule names its kind.
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Ok(Value::Array(Vec::new())))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Self::Value, A::Error> {
        while access.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Ok(Value::Object(Map::new())))
    }
}
