//! `with_*` setters for the public config structs that will grow: each such struct is
//! `#[non_exhaustive]` (a field added later breaks no embedder), so outside this crate it is
//! built from its `Default` and these setters, or by assigning its `pub` fields, never with a
//! struct literal.

/// `with_setters!(Type { with_field: field: FieldType, … })`: for each field, `pub fn
/// with_field(self, value) -> Type`, the value with that field set (no validation: the
/// struct's user validates it, as it does an assigned field).
macro_rules! with_setters {
    ($ty:ident { $($setter:ident : $field:ident : $fty:ty),* $(,)? }) => {
        impl $ty {
            $(
                #[doc = concat!("This with [`", stringify!($field), "`](Self::", stringify!($field), ") set to `value`.")]
                #[must_use]
                pub fn $setter(mut self, value: $fty) -> $ty {
                    self.$field = value;
                    self
                }
            )*
        }
    };
}
