//! [`Hex`]: fixed-width byte strings written as hex, in policy files and release manifests.

/// A fixed-width byte string written as hex in policy files.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Hex<const N: usize>(pub [u8; N]);

impl<const N: usize> std::fmt::Debug for Hex<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl<const N: usize> std::str::FromStr for Hex<N> {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let bytes = hex::decode(s.trim()).map_err(|e| format!("{e}"))?;
        let arr: [u8; N] = bytes
            .as_slice()
            .try_into()
            .map_err(|_| format!("expected {N} bytes ({} hex digits), got {}", 2 * N, bytes.len()))?;
        Ok(Self(arr))
    }
}

impl<const N: usize> serde::Serialize for Hex<N> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(&hex::encode(self.0))
    }
}

impl<'de, const N: usize> serde::Deserialize<'de> for Hex<N> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}
