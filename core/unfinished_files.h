// Files being written that must not outlive an interrupted write: the
// temporary file of an atomic save (nn/safetensors.cpp) is tracked from its
// creation until its rename, so that a signal handler ending the process
// (parallel/'s SIGTERM handler under mpirun) can remove it.
#pragma once
#include <string>

namespace anvil {

// Tracks `path`; returns its slot for untrack_unfinished_file, or -1 when it
// cannot be tracked (every slot taken, or a path longer than 4095 bytes).
int track_unfinished_file(const std::string& path);
// The file is finished (renamed) or removed: forget it. -1 is ignored.
void untrack_unfinished_file(int slot);
// Removes (unlink) every tracked file. Async-signal-safe: for a handler that
// ends the process.
void remove_unfinished_files();

}  // namespace anvil
