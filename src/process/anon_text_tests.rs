//! This process's own libc text, presented as if it were anonymous memory:
//! recognised as libc's at its file offset; other bytes or places are not.

use super::*;
use crate::process::maps::read_maps;

/// This process's maps, and the index of libc's executable mapping.
fn own_maps() -> (Vec<MapsEntry>, usize) {
    let entries = read_maps(std::process::id()).expect("own maps");
    let libc = entries
        .iter()
        .position(|e| e.executable && e.path.contains("/libc.so"))
        .expect("libc mapped");
    (entries, libc)
}

/// `entry` as `/proc/PID/maps` shows anonymous memory.
fn anonymous(entry: &MapsEntry) -> MapsEntry {
    MapsEntry {
        file_offset: 0,
        dev: 0,
        inode: 0,
        path: String::new(),
        ..entry.clone()
    }
}

#[test]
fn a_copy_of_a_files_text_is_that_files() {
    let (mut entries, libc) = own_maps();
    let text = entries[libc].clone();
    entries[libc] = anonymous(&text);
    let mut tracker = ProcessTracker::new();
    let pid = std::process::id();
    let (object, offset) = tracker
        .anonymous_text(pid, &entries[libc], &entries)
        .expect("recognised");
    assert_eq!(offset, text.file_offset);
    let object = tracker.object(object).expect("opened");
    assert_eq!(object.path, text.path);
    assert_eq!(object.vaddr_of_offset(offset), {
        // The same virtual address the file mapping gives.
        let file = tracker.object(tracker.object_index[&(text.dev, text.inode)]);
        file.expect("object").vaddr_of_offset(text.file_offset)
    });

    // Through apply_maps: a mapping of libc's object, named by its path.
    tracker.apply_maps(pid, &entries);
    let id = tracker.process_mappings(pid)[tracker
        .process_mappings(pid)
        .iter()
        .position(|&id| tracker.mapping(id).is_some_and(|m| m.start == text.start))
        .expect("interned")];
    let mapping = tracker.mapping(id).expect("held");
    assert_eq!(
        mapping.object,
        Some(tracker.object_index[&(text.dev, text.inode)])
    );
    assert_eq!(mapping.file_offset, text.file_offset);
    assert_eq!(mapping.name, text.path);
}

#[test]
fn other_bytes_or_places_are_not_a_files_text() {
    let (mut entries, libc) = own_maps();
    let text = entries[libc].clone();
    let pid = std::process::id();
    let mut tracker = ProcessTracker::new();
    // libc's text compared with the file one page further on: other bytes.
    let object = tracker.intern_object(pid, &text).expect("libc opens");
    let file = &tracker.object(object).expect("held").file;
    let segment = load_segments(file)
        .into_iter()
        .find(|s| s.4 && s.0 & !(PAGE - 1) <= text.file_offset)
        .expect("text segment");
    assert!(same_bytes(pid, file, &text, text.file_offset, segment));
    assert!(!same_bytes(
        pid,
        file,
        &text,
        text.file_offset + PAGE,
        segment
    ));
    // libc's other mappings a page higher than they are: its text would
    // be elsewhere.
    let key = (text.dev, text.inode);
    let mut moved = entries.clone();
    for e in moved.iter_mut().filter(|e| (e.dev, e.inode) == key) {
        e.start += PAGE;
        e.end += PAGE;
    }
    moved[libc] = anonymous(&text);
    assert_eq!(tracker.anonymous_text(pid, &moved[libc], &moved), None);
    // Anonymous memory far from every file (the stack's range).
    let stack = entries.iter().find(|e| e.path == "[stack]").expect("stack");
    let far = anonymous(stack);
    assert_eq!(tracker.anonymous_text(pid, &far, &entries), None);
    // Without libc's other mappings, nothing says where libc would be.
    entries[libc] = anonymous(&text);
    entries.retain(|e| (e.dev, e.inode) != key);
    assert_eq!(
        tracker.anonymous_text(pid, &anonymous(&text), &entries),
        None
    );
}
