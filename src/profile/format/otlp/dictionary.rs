//! The `ProfilesDictionary` under construction: every table starts with its
//! zero element (index 0 means "none", as the spec requires) and each
//! string, attribute, function and stack is stored once, at the index it
//! got when first used.

use std::collections::HashMap;

use super::proto::common::{any_value, AnyValue};
use super::proto::profiles::{Function, KeyValueAndUnit, Link, ProfilesDictionary, Stack};

/// An attribute value the encoder writes: an integer or a string.
#[derive(Debug, Clone, Copy)]
pub(super) enum Value<'a> {
    /// `int_value`.
    Int(i64),
    /// `string_value`.
    Str(&'a str),
}

/// An attribute value as the dictionary tells values apart: strings by
/// their index in the string table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum AttributeId {
    Int(i64),
    Str(i32),
}

/// Builds a [`ProfilesDictionary`]. Mappings and locations are pushed by
/// the caller (one per profile mapping and frame, already distinct);
/// strings, attributes, functions and stacks are deduplicated here.
pub(super) struct Dictionary {
    table: ProfilesDictionary,
    strings: HashMap<String, i32>,
    /// (key's string index, value) -> attribute index.
    attributes: HashMap<(i32, AttributeId), i32>,
    functions: HashMap<(i32, i32, i32), i32>,
    stacks: HashMap<Vec<i32>, i32>,
}

impl Dictionary {
    /// An empty dictionary: each table holds only its zero element (the
    /// link table's is 16 and 8 zero bytes, as the spec recommends).
    pub(super) fn new() -> Self {
        let table = ProfilesDictionary {
            mapping_table: vec![Default::default()],
            location_table: vec![Default::default()],
            function_table: vec![Default::default()],
            link_table: vec![Link {
                trace_id: vec![0; 16],
                span_id: vec![0; 8],
            }],
            string_table: vec![String::new()],
            attribute_table: vec![Default::default()],
            stack_table: vec![Default::default()],
        };
        Dictionary {
            strings: HashMap::from([(String::new(), 0)]),
            table,
            attributes: HashMap::new(),
            functions: HashMap::new(),
            stacks: HashMap::new(),
        }
    }

    /// The tables built so far, for pushing mappings and locations.
    pub(super) fn tables(&mut self) -> &mut ProfilesDictionary {
        &mut self.table
    }

    /// The index of `value` in the string table.
    pub(super) fn string(&mut self, value: &str) -> i32 {
        if let Some(&i) = self.strings.get(value) {
            return i;
        }
        let i = index(self.table.string_table.len());
        self.table.string_table.push(value.to_string());
        self.strings.insert(value.to_string(), i);
        i
    }

    /// The index of the attribute `key` = `value` in the attribute table.
    pub(super) fn attribute(&mut self, key: &str, value: Value<'_>) -> i32 {
        let key = self.string(key);
        let id = match value {
            Value::Int(n) => AttributeId::Int(n),
            Value::Str(s) => AttributeId::Str(self.string(s)),
        };
        if let Some(&i) = self.attributes.get(&(key, id)) {
            return i;
        }
        let value = match value {
            Value::Int(n) => any_value::Value::IntValue(n),
            Value::Str(s) => any_value::Value::StringValue(s.to_string()),
        };
        let i = index(self.table.attribute_table.len());
        self.table.attribute_table.push(KeyValueAndUnit {
            key_strindex: key,
            value: Some(AnyValue { value: Some(value) }),
            unit_strindex: 0,
        });
        self.attributes.insert((key, id), i);
        i
    }

    /// The index of the function (name, system name, file name) in the
    /// function table.
    pub(super) fn function(&mut self, name: &str, system_name: &str, file: &str) -> i32 {
        let key = (
            self.string(name),
            self.string(system_name),
            self.string(file),
        );
        *self.functions.entry(key).or_insert_with(|| {
            self.table.function_table.push(Function {
                name_strindex: key.0,
                system_name_strindex: key.1,
                filename_strindex: key.2,
                start_line: 0,
            });
            index(self.table.function_table.len() - 1)
        })
    }

    /// The index of the stack of `locations` (leaf first) in the stack table.
    pub(super) fn stack(&mut self, locations: Vec<i32>) -> i32 {
        if let Some(&i) = self.stacks.get(&locations) {
            return i;
        }
        let i = index(self.table.stack_table.len());
        self.table.stack_table.push(Stack {
            location_indices: locations.clone(),
        });
        self.stacks.insert(locations, i);
        i
    }

    /// The finished dictionary.
    pub(super) fn finish(self) -> ProfilesDictionary {
        self.table
    }
}

/// A table length as an index (tables are indexed by `int32`; a profile
/// of more than 2^31 distinct items cannot be encoded).
pub(super) fn index(len: usize) -> i32 {
    i32::try_from(len).expect("an OTLP dictionary table holds at most 2^31 entries")
}
