//! Lists whose freed places are used again: an item keeps its index for
//! as long as it is in the list, and a new one takes a freed place before
//! the list grows.

/// Puts `item` in a place of `items` listed in `free` (taking it off that
/// list), or at the end if none is; its index.
pub(crate) fn put<T>(items: &mut Vec<T>, free: &mut Vec<usize>, item: T) -> usize {
    match free.pop() {
        Some(at) => {
            items[at] = item;
            at
        }
        None => {
            items.push(item);
            items.len() - 1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_freed_place_is_used_before_the_list_grows() {
        let (mut items, mut free) = (Vec::new(), Vec::new());
        assert_eq!(put(&mut items, &mut free, 'a'), 0);
        assert_eq!(put(&mut items, &mut free, 'b'), 1);
        free.push(0);
        assert_eq!(put(&mut items, &mut free, 'c'), 0);
        assert_eq!(put(&mut items, &mut free, 'd'), 2);
        assert_eq!((items, free), (vec!['c', 'b', 'd'], vec![]));
    }
}
