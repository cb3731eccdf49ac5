//! [`Slab`]: a vector of entries addressed by small stable indices, whose freed slots are
//! reused (the allocator's blocks and segments link to each other by index).

/// Entries addressed by `u32` indices that stay valid until the entry is removed.
pub(crate) struct Slab<T> {
    entries: Vec<Option<T>>,
    vacant: Vec<u32>,
    len: usize,
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Slab {
            entries: Vec::new(),
            vacant: Vec::new(),
            len: 0,
        }
    }
}

impl<T> Slab<T> {
    /// Store `value`; returns its index.
    ///
    /// # Panics
    /// With more than `u32::MAX` entries (each block is at least 512 bytes of device
    /// memory, so that is two terabytes of blocks).
    #[inline(always)]
    pub(crate) fn insert(&mut self, value: T) -> u32 {
        self.len += 1;
        if let Some(index) = self.vacant.pop() {
            self.entries[index as usize] = Some(value);
            return index;
        }
        let index = u32::try_from(self.entries.len()).expect("fewer than 2^32 entries");
        self.entries.push(Some(value));
        index
    }

    /// Take the entry at `index` out.
    ///
    /// # Panics
    /// If there is no entry there (a bookkeeping bug).
    #[inline]
    pub(crate) fn remove(&mut self, index: u32) -> T {
        let value = self.entries[index as usize]
            .take()
            .expect("removing a vacant slab entry");
        self.vacant.push(index);
        self.len -= 1;
        value
    }

    /// The entry at `index`, if there is one.
    #[cfg(test)]
    pub(crate) fn get(&self, index: u32) -> Option<&T> {
        self.entries.get(index as usize).and_then(Option::as_ref)
    }

    /// The number of entries.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Every entry with its index.
    #[cfg(test)]
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u32, &T)> {
        self.entries
            .iter()
            .enumerate()
            .filter_map(|(i, e)| e.as_ref().map(|e| (i as u32, e)))
    }
}

impl<T> std::ops::Index<u32> for Slab<T> {
    type Output = T;
    #[inline]
    fn index(&self, index: u32) -> &T {
        self.entries[index as usize]
            .as_ref()
            .expect("reading a vacant slab entry")
    }
}

impl<T> std::ops::IndexMut<u32> for Slab<T> {
    #[inline]
    fn index_mut(&mut self, index: u32) -> &mut T {
        self.entries[index as usize]
            .as_mut()
            .expect("writing a vacant slab entry")
    }
}

#[cfg(test)]
mod tests {
    use super::Slab;

    #[test]
    fn indices_are_stable_and_reused() {
        let mut slab = Slab::default();
        let a = slab.insert("a");
        let b = slab.insert("b");
        assert_eq!((slab[a], slab[b], slab.len()), ("a", "b", 2));
        assert_eq!(slab.remove(a), "a");
        assert!(slab.get(a).is_none());
        let c = slab.insert("c");
        assert_eq!(c, a, "the vacant slot is reused");
        slab[b] = "B";
        let all: Vec<_> = slab.iter().collect();
        assert_eq!(all, vec![(a, &"c"), (b, &"B")]);
    }
}
