//! Text from outside (a file, etcd, a request) shown in messages: cut
//! short, so that a long value is never copied whole into every log line
//! and answer. Callers quote or escape what they show.

/// `text` cut to its first `max` bytes (at a character boundary), saying
/// so and how long it was; whole when it fits.
#[must_use]
pub fn clip(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}... ({} bytes)", &text[..end], text.len())
}

#[cfg(test)]
mod tests {
    use super::clip;

    #[test]
    fn long_text_is_cut_at_a_character_saying_how_long_it_was() {
        assert_eq!(clip("node-1", 64), "node-1");
        assert_eq!(clip(&"a".repeat(64), 64), "a".repeat(64));
        assert_eq!(
            clip(&"a".repeat(65), 64),
            format!("{}... (65 bytes)", "a".repeat(64))
        );
        // "é" is two bytes: a cut inside it moves back to its start.
        assert_eq!(clip("aé", 2), "a... (3 bytes)");
        assert_eq!(clip("ééé", 0), "... (6 bytes)");
    }
}
