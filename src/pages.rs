//! Giving back the executable's pages that start-up touched.
//!
//! Most of lazyquota's resident memory is its own code: the kernel maps a program's file pages
//! 64 KiB around each one it faults in ("fault-around"; on filesystems with large page cache
//! folios, the whole folio holding it), so parsing flags and the kubeconfig,
//! setting up TLS, discovery and the first lists leave most of the text mapped, though the
//! steady state runs a fraction of it. Once the quotas are listed and written, the clean
//! read-only mappings of the executable are dropped from this process's page tables
//! (`MADV_DONTNEED`); what the controller runs from then on faults back in from the page cache,
//! and only that stays resident. The pages stay in the page cache (unmapped, so the kernel may
//! reclaim them first); nothing is read from disk unless it was reclaimed.
//!
//! `unsafe`: `madvise` takes a raw address range. This is the binary's only unsafe code; the
//! library crates forbid it.

use std::{io, time::Duration};

use crate::server::{Admin, ready};

/// One mapping of the executable that `MADV_DONTNEED` may drop: not writable and without a
/// private (anonymous) page, so every page reads back from the file exactly as it was.
#[derive(Debug, PartialEq, Eq)]
struct Clean {
    start: usize,
    len: usize,
    resident_kib: u64,
}

/// One mapping of `/proc/self/smaps` being read.
struct Mapping {
    start: usize,
    end: usize,
    writable: bool,
    resident_kib: u64,
    /// Its private pages; `None` until smaps says (then it is not dropped).
    anonymous_kib: Option<u64>,
}

impl Mapping {
    fn clean(&self) -> Option<Clean> {
        (!self.writable && self.anonymous_kib == Some(0)).then_some(Clean {
            start: self.start,
            len: self.end - self.start,
            resident_kib: self.resident_kib,
        })
    }
}

/// The executable's clean mappings, from `/proc/self/smaps` text and the executable's path.
fn clean_mappings(smaps: &str, exe: &str) -> Vec<Clean> {
    let mut found = Vec::new();
    let mut current: Option<Mapping> = None;
    for line in smaps.lines() {
        let mut fields = line.split_whitespace();
        let Some(first) = fields.next() else { continue };
        if let Some((start, end)) = first.split_once('-')
            && let (Ok(start), Ok(end)) = (usize::from_str_radix(start, 16), usize::from_str_radix(end, 16))
        {
            found.extend(current.take().and_then(|m| m.clean()));
            let perms = fields.next().unwrap_or("");
            // offset, device, inode, then the path (which may hold spaces).
            let path = fields.skip(3).collect::<Vec<_>>().join(" ");
            current = (path == exe).then(|| Mapping {
                start,
                end,
                writable: perms.contains('w'),
                resident_kib: 0,
                anonymous_kib: None,
            });
            continue;
        }
        let kib = fields.next().and_then(|v| v.parse::<u64>().ok());
        if let Some(mapping) = current.as_mut() {
            match first {
                "Rss:" => mapping.resident_kib = kib.unwrap_or(0),
                "Anonymous:" => mapping.anonymous_kib = kib,
                _ => {}
            }
        }
    }
    found.extend(current.and_then(|m| m.clean()));
    found
}

/// Drops the executable's clean mappings from the page tables; returns the KiB that were
/// resident in them.
pub fn release_startup_pages() -> io::Result<u64> {
    let exe = std::fs::read_link("/proc/self/exe")?;
    let smaps = std::fs::read_to_string("/proc/self/smaps")?;
    let mut released = 0;
    for mapping in clean_mappings(&smaps, &exe.to_string_lossy()) {
        // SAFETY: the range is one whole mapping of this executable's file that is not
        // writable and held no private page when smaps was read; nothing writes to the
        // executable's read-only mappings, so none can have gained one since. MADV_DONTNEED on
        // a private file mapping without private pages only unmaps them: the next access reads
        // the same bytes from the file (the page cache), so no code or constant changes under
        // a running thread.
        #[allow(unsafe_code)]
        let rc = unsafe {
            libc::madvise(
                mapping.start as *mut libc::c_void,
                mapping.len,
                libc::MADV_DONTNEED,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        released += mapping.resident_kib;
    }
    Ok(released)
}

/// Once lazyquota is ready (every served cluster's quotas listed, or standing by), and a while
/// after so that the first writes, watches and scrapes have run, drops the start-up code from
/// the page tables.
pub async fn release_when_ready(admin: Admin) {
    const AFTER_READY: Duration = Duration::from_secs(10);
    while !ready(&admin).await.0 {
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    tokio::time::sleep(AFTER_READY).await;
    match release_startup_pages() {
        Ok(kib) => {
            tracing::info!(
                resident_kib = kib,
                "dropped the executable's start-up pages from the page tables"
            );
        }
        Err(error) => {
            tracing::warn!(%error, "cannot drop the executable's start-up pages (they stay mapped)");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Clean, clean_mappings, release_startup_pages};

    const SMAPS: &str = "\
55d0c0000000-55d0c0200000 r--p 00000000 08:01 42 /usr/bin/lazy quota
Size:               2048 kB
Rss:                 824 kB
Anonymous:             0 kB
55d0c0200000-55d0c1000000 r-xp 00200000 08:01 42 /usr/bin/lazy quota
Rss:                9000 kB
Anonymous:             0 kB
55d0c1000000-55d0c1100000 r--p 01000000 08:01 42 /usr/bin/lazy quota
Rss:                 724 kB
Anonymous:           724 kB
55d0c1100000-55d0c1200000 rw-p 01100000 08:01 42 /usr/bin/lazy quota
Rss:                  12 kB
Anonymous:             0 kB
7f0000000000-7f0000100000 r-xp 00000000 08:01 43 /usr/lib/other.so
Rss:                 100 kB
Anonymous:             0 kB
";

    #[test]
    fn only_the_executables_read_only_mappings_without_private_pages_are_dropped() {
        // The relocated read-only data (private pages) and the writable data stay, and so
        // does another file's mapping.
        assert_eq!(
            clean_mappings(SMAPS, "/usr/bin/lazy quota"),
            vec![
                Clean {
                    start: 0x55d0_c000_0000,
                    len: 0x20_0000,
                    resident_kib: 824
                },
                Clean {
                    start: 0x55d0_c020_0000,
                    len: 0xe0_0000,
                    resident_kib: 9000
                },
            ]
        );
    }

    #[test]
    fn a_mapping_whose_private_pages_are_not_reported_is_kept() {
        let smaps = "55d0c0200000-55d0c1000000 r-xp 00200000 08:01 42 /bin/x\nRss: 9000 kB\n";
        assert_eq!(clean_mappings(smaps, "/bin/x"), vec![]);
    }

    /// Read-only data of the test binary that only the test below reads: 4 MiB, so that the
    /// page cache folio holding its middle page (at most 2 MiB, aligned in the file) lies
    /// wholly inside it, and nothing else faults that page back in.
    static PROBE: [u8; 4 << 20] = [7; 4 << 20];
    const MIDDLE: usize = 2 << 20;

    /// Whether the page holding `address` is mapped in this process's page tables
    /// (`/proc/self/pagemap`: one 64-bit entry per virtual page, bit 63 "present").
    fn mapped(address: usize) -> bool {
        use std::io::{Read, Seek, SeekFrom};
        let page = 4096;
        let mut pagemap = std::fs::File::open("/proc/self/pagemap").unwrap();
        pagemap
            .seek(SeekFrom::Start((address / page * 8) as u64))
            .unwrap();
        let mut entry = [0; 8];
        pagemap.read_exact(&mut entry).unwrap();
        u64::from_le_bytes(entry) >> 63 == 1
    }

    #[test]
    fn a_read_only_page_of_the_executable_is_unmapped_and_reads_back_the_same() {
        // One page, not the executable's resident total: with large page cache folios the
        // kernel maps a whole folio on a fault, so the code this test runs after the release
        // maps back most of what it ran before (the total went up once in CI).
        assert_eq!(read_through(), 7);
        let address = std::ptr::from_ref(&PROBE[MIDDLE]) as usize;
        assert!(mapped(address), "the probe page is not mapped after a read");
        let released = release_startup_pages().expect("madvise");
        assert!(released > 0, "nothing of the executable was resident");
        assert!(
            !mapped(address),
            "the probe page is still mapped after the executable's clean mappings were dropped"
        );
        // It reads back from the file, and this test's code ran on from it too.
        assert_eq!(read_through(), 7);
        assert!(mapped(address), "the probe page was read but is not mapped");
    }

    /// A read of the probe's middle byte that the compiler cannot fold into the constant.
    fn read_through() -> u8 {
        std::hint::black_box(&PROBE)[MIDDLE]
    }
}
