//! Requests per second per API key: a token bucket for each key, holding up to `burst`
//! requests and refilled at `rate` per second. A key over its rate is answered 429 with
//! the seconds until its next request would pass (`Retry-After`), so one client cannot
//! crowd the others out of the backends.

use std::{
    collections::HashMap,
    sync::Mutex,
    time::{Duration, Instant},
};

use super::keys::KeyDigest;

pub struct RateLimit {
    rate: f64,
    burst: f64,
    buckets: Mutex<HashMap<KeyDigest, Bucket>>,
}

struct Bucket {
    tokens: f64,
    at: Instant,
}

impl RateLimit {
    /// `rate` requests per second on average, `burst` at once; both positive (checked by the
    /// configuration).
    pub fn new(rate: f64, burst: u32) -> RateLimit {
        RateLimit { rate, burst: f64::from(burst.max(1)), buckets: Mutex::new(HashMap::new()) }
    }

    /// Takes one request from `key`'s bucket at `now`, or tells how long until one is there.
    /// Buckets exist for keys that authenticated only, so there are as many as keys used.
    pub fn take(&self, key: &KeyDigest, now: Instant) -> Result<(), Duration> {
        let mut buckets = self.buckets.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let b = buckets.entry(*key).or_insert(Bucket { tokens: self.burst, at: now });
        let elapsed = now.saturating_duration_since(b.at).as_secs_f64();
        b.tokens = (b.tokens + elapsed * self.rate).min(self.burst);
        b.at = now.max(b.at);
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - b.tokens) / self.rate))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_passes_then_the_rate_holds_per_key() {
        let limit = RateLimit::new(2.0, 3);
        let (a, b) = (KeyDigest::of("a"), KeyDigest::of("b"));
        let t0 = Instant::now();
        for _ in 0..3 {
            assert!(limit.take(&a, t0).is_ok());
        }
        let wait = limit.take(&a, t0).unwrap_err();
        assert!((wait.as_secs_f64() - 0.5).abs() < 1e-9, "{wait:?}");
        assert!(limit.take(&b, t0).is_ok(), "another key has its own bucket");
        // Half a second later one more request passes, then none.
        let t1 = t0 + Duration::from_millis(500);
        assert!(limit.take(&a, t1).is_ok());
        assert!(limit.take(&a, t1).is_err());
        // Long idle refills to the burst, not beyond.
        let t2 = t1 + Duration::from_secs(60);
        for _ in 0..3 {
            assert!(limit.take(&a, t2).is_ok());
        }
        assert!(limit.take(&a, t2).is_err());
        // A clock that appears to go back (an earlier `now` from a slower thread) takes
        // nothing away.
        assert!(limit.take(&b, t0).is_ok());
    }
}
