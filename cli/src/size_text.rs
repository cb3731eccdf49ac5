//! Byte counts for people: `64 MiB`, `139.81 GiB`.

/// `bytes` in the largest binary unit it reaches: whole numbers when exact (`64 MiB`),
/// else two decimals (`139.81 GiB`).
pub(crate) fn format_bytes(bytes: u64) -> String {
    const UNITS: [(&str, u32); 4] = [("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)];
    for (unit, shift) in UNITS {
        let scale = 1u64 << shift;
        if bytes >= scale {
            return if bytes.is_multiple_of(scale) {
                format!("{} {unit}", bytes >> shift)
            } else {
                format!("{:.2} {unit}", bytes as f64 / scale as f64)
            };
        }
    }
    format!("{bytes} B")
}

#[cfg(test)]
mod tests {
    use super::format_bytes;

    #[test]
    fn exact_and_fractional_sizes() {
        assert_eq!(format_bytes(0), "0 B");
        assert_eq!(format_bytes(1023), "1023 B");
        assert_eq!(format_bytes(64 << 10), "64 KiB");
        assert_eq!(format_bytes(1 << 20), "1 MiB");
        assert_eq!(format_bytes(3 << 30), "3 GiB");
        assert_eq!(format_bytes((1 << 30) + (1 << 29)), "1.50 GiB");
        assert_eq!(format_bytes(150_115_729_408), "139.81 GiB");
        assert_eq!(format_bytes(2 << 40), "2 TiB");
    }
}
