//! A configuration section: a clap `Args` struct whose fields are flags and
//! config-file keys, and which can name the fields that differ between two
//! of its values (what a reload compares).

/// Defines a section: the struct as written, and `changed`, which names
/// (by clap argument id) every field whose typed value differs.
macro_rules! section {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            $( $(#[$field_meta:meta])* pub $field:ident : $ty:ty, )*
        }
    ) => {
        $(#[$meta])*
        pub struct $name {
            $( $(#[$field_meta])* pub $field: $ty, )*
        }

        impl $name {
            /// The argument ids of the fields whose value differs in `other`.
            #[must_use]
            pub fn changed(&self, other: &Self) -> Vec<&'static str> {
                let mut ids = Vec::new();
                $( if self.$field != other.$field { ids.push(stringify!($field)); } )*
                ids
            }
        }
    };
}
pub(crate) use section;
