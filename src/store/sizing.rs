//! How large a zone must be: the exact arithmetic of nginx's slab pool and of the zone's own
//! block, so that `nginx -t` refuses a zone that could not start, with the size that would do.

use core::mem;

use nginx_sys::{ngx_slab_page_t, ngx_slab_pool_t, ngx_slab_stat_t};

use ratelimit_core::block_table::{BlockTable, PROBE_RECORDS, RECORD_WORDS};

use super::slots::{PROBE_BUCKETS, SLOTS_PER_BUCKET};
use super::{ZoneLayout, TABLE_OFFSET};

/// A zone with `block=` gives this share of its table to blocked keys (1/8).
const BLOCK_SHARE: usize = 8;
/// The fewest records a block table has: eight probe windows.
pub const MIN_BLOCK_RECORDS: usize = 8 * PROBE_RECORDS;
/// Bytes of one blocked key's record.
pub const BLOCK_RECORD_BYTES: usize = 8 * RECORD_WORDS;

/// Smallest table a zone may have: one probe window.
const MIN_SLOTS: usize = SLOTS_PER_BUCKET * PROBE_BUCKETS;

/// Bytes of one bucket of slots with `slot_words` state words each.
pub(super) fn bucket_bytes(slot_words: usize) -> usize {
    8 * (1 + slot_words) * SLOTS_PER_BUCKET
}

/// The records of the block table a zone with `block=` keeps at the end of its table of
/// `table_bytes`: an eighth of it, at least [`MIN_BLOCK_RECORDS`]; 0 without `block=`.
pub(super) fn block_records(table_bytes: usize, block: bool) -> usize {
    if !block {
        return 0;
    }
    (table_bytes / BLOCK_SHARE / BLOCK_RECORD_BYTES).max(MIN_BLOCK_RECORDS)
}

/// Bytes of the block table of `records` records.
pub(super) fn block_table_bytes(records: usize) -> usize {
    BlockTable::words_for(records) * 8
}

/// The buckets a table of `table_bytes` holds; `None` if not even one probe window fits.
pub(super) fn buckets(table_bytes: usize, slot_words: usize) -> Option<usize> {
    let buckets = table_bytes / bucket_bytes(slot_words);
    (buckets >= PROBE_BUCKETS && buckets * SLOTS_PER_BUCKET >= MIN_SLOTS).then_some(buckets)
}

/// For an error message: why a zone of this layout is too small, and the smallest size (in
/// KiB, as sizes are written in configs) that it works with. An algorithm that keeps several
/// words per key says what each key takes, since that is what makes it large.
pub fn size_hint(layout: &ZoneLayout, pagesize: usize) -> String {
    let minimum = match min_zone_kib(layout.slot_words(), layout.block, pagesize) {
        Some(kib) => format!("the minimum is {kib}k"),
        None => "no zone size fits it".to_string(),
    };
    if layout.block {
        let blocks = format!(
            " with block= (an eighth of the zone, at least {MIN_BLOCK_RECORDS} keys of \
             {BLOCK_RECORD_BYTES} bytes, keeps the blocked keys)"
        );
        if layout.algorithm.is_single_word() {
            return format!("{blocks}: {minimum}");
        }
        return format!(
            "{blocks} for {} with {} requests per window (each key takes {} bytes): {minimum}",
            layout.algorithm,
            layout.limits.rate.whole_requests().unwrap_or(0),
            8 * (1 + layout.slot_words())
        );
    }
    if layout.algorithm.is_single_word() {
        return format!(": {minimum}");
    }
    if layout.algorithm.counts_in_flight() {
        return format!(
            " for concurrency (each key takes {} bytes): {minimum}",
            8 * (1 + layout.slot_words())
        );
    }
    format!(
        " for {} with {} requests per window (each key takes {} bytes): {minimum}",
        layout.algorithm,
        layout.limits.rate.whole_requests().unwrap_or(0),
        8 * (1 + layout.slot_words())
    )
}

/// Whether a zone of `size` bytes holds the header, one probe window of slots of
/// `slot_words` state words and, with `block`, its block table: exactly the tests
/// `Zone::init` and `Zone::format` make on the pages nginx's slab pool leaves free in a zone
/// of that size.
pub fn zone_size_fits(size: usize, slot_words: usize, block: bool, pagesize: usize) -> bool {
    let block_bytes = block_pages(slab_free_pages(size, pagesize)) * pagesize;
    block_bytes >= TABLE_OFFSET + 64 && table_fits(block_bytes - TABLE_OFFSET, slot_words, block)
}

/// The slot buckets and block records a table of `table_bytes` holds, when at least one
/// probe window of slots fits beside the block table.
pub(super) fn table_shape(
    table_bytes: usize,
    slot_words: usize,
    block: bool,
) -> Option<(usize, usize)> {
    let records = block_records(table_bytes, block);
    let slot_bytes = table_bytes.checked_sub(block_table_bytes(records))?;
    Some((buckets(slot_bytes, slot_words)?, records))
}

fn table_fits(table_bytes: usize, slot_words: usize, block: bool) -> bool {
    table_shape(table_bytes, slot_words, block).is_some()
}

/// The smallest zone size in whole KiB that [`zone_size_fits`], if any up to 1 GiB does.
/// Every larger size fits too: the free pages and the block grow with the size.
pub fn min_zone_kib(slot_words: usize, block: bool, pagesize: usize) -> Option<usize> {
    (1..=1 << 20).find(|kib| zone_size_fits(kib * 1024, slot_words, block, pagesize))
}

/// Pages of the zone's block out of the slab pool's free pages: all but a few, left for the
/// slab allocator's own use and the override keys. The reserve grows from 1 to 8 pages
/// between 64 and 71 free pages, so that a larger zone never has a smaller block.
pub(super) fn block_pages(free_pages: usize) -> usize {
    free_pages.saturating_sub(free_pages.saturating_sub(63).clamp(1, 8))
}

/// The free pages nginx's slab pool has in a fresh zone of `size` bytes: `ngx_slab_init`'s
/// arithmetic. The pool header, its size-class lists and statistics, and one page
/// descriptor per page come first, from the page-aligned start of the mapping; the pages
/// start at the next page boundary.
fn slab_free_pages(size: usize, pagesize: usize) -> usize {
    // One list and one statistics entry per size class, from 8 bytes (min_shift 3) up to a
    // page (`ngx_pagesize_shift - pool->min_shift` of them).
    let classes = (pagesize.trailing_zeros() as usize).saturating_sub(3);
    let page_desc = mem::size_of::<ngx_slab_page_t>();
    let metadata = mem::size_of::<ngx_slab_pool_t>()
        + classes * (page_desc + mem::size_of::<ngx_slab_stat_t>());
    let Some(rest) = size.checked_sub(metadata) else {
        return 0;
    };
    let pages = rest / (pagesize + page_desc);
    let start = (metadata + pages * page_desc).next_multiple_of(pagesize);
    pages.min(size.saturating_sub(start) / pagesize)
}
