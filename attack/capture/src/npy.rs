//! Minimal `.npy` (format 1.0) writer: what numpy's `np.load` reads without any Rust
//! dependency on a zip or array crate.

use std::{fs::File, io::Write, path::Path};

/// Element types the harness writes.
pub trait Element: Copy {
    const DESCR: &'static str;
    fn put(self, out: &mut Vec<u8>);
}

impl Element for f32 {
    const DESCR: &'static str = "<f4";
    fn put(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes());
    }
}

impl Element for i64 {
    const DESCR: &'static str = "<i8";
    fn put(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes());
    }
}

impl Element for i32 {
    const DESCR: &'static str = "<i4";
    fn put(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes());
    }
}

/// The words of a ring operand, exactly (`np.uint32`).
impl Element for u32 {
    const DESCR: &'static str = "<u4";
    fn put(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes());
    }
}

/// The int8 rows a ring operand masks.
impl Element for i8 {
    const DESCR: &'static str = "|i1";
    fn put(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes());
    }
}

/// The header of a C-ordered array of `shape`, padded so the data starts on a 64-byte
/// boundary as the format asks.
fn header<T: Element>(shape: &[usize]) -> Vec<u8> {
    let dims = match shape {
        [n] => format!("({n},)"),
        _ => format!("({})", shape.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ")),
    };
    let dict = format!("{{'descr': '{}', 'fortran_order': False, 'shape': {dims}, }}", T::DESCR);
    let unpadded = 10 + dict.len() + 1;
    let pad = unpadded.div_ceil(64) * 64 - unpadded;
    let mut h = Vec::with_capacity(unpadded + pad);
    h.extend_from_slice(b"\x93NUMPY\x01\x00");
    h.extend_from_slice(&((dict.len() + pad + 1) as u16).to_le_bytes());
    h.extend_from_slice(dict.as_bytes());
    h.extend(std::iter::repeat_n(b' ', pad));
    h.push(b'\n');
    h
}

/// Writes `data` (row-major, `shape`) to `path`.
pub fn write<T: Element>(path: &Path, shape: &[usize], data: &[T]) -> std::io::Result<()> {
    let expected: usize = shape.iter().product();
    if expected != data.len() {
        return Err(std::io::Error::other(format!("{}: shape {shape:?} but {} elements", path.display(), data.len())));
    }
    let mut f = std::io::BufWriter::with_capacity(1 << 20, File::create(path)?);
    f.write_all(&header::<T>(shape))?;
    let mut buf = Vec::with_capacity(1 << 16);
    for chunk in data.chunks(1 << 14) {
        buf.clear();
        chunk.iter().for_each(|v| v.put(&mut buf));
        f.write_all(&buf)?;
    }
    f.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_is_aligned_and_parsable() {
        for shape in [vec![3usize], vec![2, 5], vec![0, 384], vec![123_456, 1536]] {
            let h = header::<f32>(&shape);
            assert_eq!(h.len() % 64, 0, "{shape:?}");
            assert_eq!(&h[..6], b"\x93NUMPY");
            assert_eq!(*h.last().unwrap(), b'\n');
            let len = u16::from_le_bytes([h[8], h[9]]) as usize;
            assert_eq!(10 + len, h.len());
        }
        assert!(String::from_utf8_lossy(&header::<i64>(&[7])).contains("'shape': (7,)"));
        assert!(String::from_utf8_lossy(&header::<u32>(&[2, 3])).contains("'descr': '<u4'"));
        assert!(String::from_utf8_lossy(&header::<i8>(&[2, 3])).contains("'descr': '|i1'"));
    }

    #[test]
    fn words_and_int8_are_written_exactly() {
        let dir = std::env::temp_dir().join(format!("gelo-npy-words-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let words = [0u32, 1, 0x8000_0001, u32::MAX];
        write(&dir.join("w.npy"), &[2, 2], &words).unwrap();
        let bytes = std::fs::read(dir.join("w.npy")).unwrap();
        let h = header::<u32>(&[2, 2]).len();
        let back: Vec<u32> = bytes[h..].chunks(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect();
        assert_eq!(back, words);
        write(&dir.join("q.npy"), &[3], &[-127i8, 0, 127]).unwrap();
        let bytes = std::fs::read(dir.join("q.npy")).unwrap();
        assert_eq!(&bytes[header::<i8>(&[3]).len()..], &[0x81, 0, 0x7f]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn refuses_a_shape_that_does_not_match() {
        let dir = std::env::temp_dir().join(format!("gelo-npy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert!(write(&dir.join("x.npy"), &[2, 2], &[1.0f32, 2.0, 3.0]).is_err());
        write(&dir.join("y.npy"), &[1, 3], &[1.0f32, 2.0, 3.0]).unwrap();
        let bytes = std::fs::read(dir.join("y.npy")).unwrap();
        let h = header::<f32>(&[1, 3]).len();
        assert_eq!(bytes.len(), h + 12);
        assert_eq!(&bytes[h..h + 4], &1.0f32.to_le_bytes());
        assert_eq!(&bytes[h + 8..], &3.0f32.to_le_bytes());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
