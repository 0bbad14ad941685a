// The MPI job's SIGTERM handler (mpi_detail::install_sigterm_handler in
// parallel/mpi_internal.h): mpirun ends a job's ranks with SIGTERM, and a
// rank says so instead of vanishing without a word.
#include <signal.h>
#include <unistd.h>

#include <csignal>

#include "core/unfinished_files.h"
#include "parallel/mpi_internal.h"

namespace anvil::parallel::mpi_detail {
namespace {

// This process's rank in the job, for the SIGTERM handler, which may call
// nothing that is not async-signal-safe: set before the handler is installed.
volatile std::sig_atomic_t g_signal_rank = -1;

// SIGTERM under mpirun: say so on this rank, rather than vanish without a
// word, and remove the temporary file of a save it cut off. The sender
// decides the words: mpirun (this process's parent, or its daemon on another
// machine) ends every rank that is left when one fails or is killed, or
// when it is stopped itself; any other sender signalled this rank alone.
// Only write(), getppid(), unlink() and _exit(): the text is put together by
// hand.
void on_sigterm(int, siginfo_t* info, void*) {
  remove_unfinished_files();
  char text[240];
  size_t n = 0;
  auto put = [&](const char* s) {
    while (*s != '\0' && n < sizeof text) text[n++] = *s++;
  };
  auto put_number = [&](long v) {
    char digits[24];
    int d = 0;
    for (long r = v < 0 ? 0 : v; d == 0 || r > 0; r /= 10) digits[d++] = char('0' + r % 10);
    while (d > 0 && n < sizeof text) text[n++] = digits[--d];
  };
  put("anvil: rank ");
  if (g_signal_rank < 0) put("?");
  else put_number(long(g_signal_rank));
  const pid_t sender = info != nullptr ? info->si_pid : 0;
  if (info != nullptr && info->si_code <= 0 && sender != ::getppid()) {
    put(": stopped by SIGTERM sent to this rank (by process ");
    put_number(long(sender));
    put(", not mpirun): the MPI job is ending\n");
  } else {
    put(": stopped by SIGTERM from mpirun: the MPI job is ending (another rank failed or was "
        "killed, or mpirun was stopped)\n");
  }
  (void)!::write(2, text, n);
  ::_exit(128 + SIGTERM);
}

}  // namespace

void install_sigterm_handler() {
  if (mpi_rank_from_environment() < 0) return;  // not started by mpirun: nobody sends it
  g_signal_rank = std::sig_atomic_t(world_rank());
  struct sigaction old {};
  sigaction(SIGTERM, nullptr, &old);
  if ((old.sa_flags & SA_SIGINFO) != 0 || old.sa_handler != SIG_DFL) return;  // the program's own handler stays
  struct sigaction action {};
  action.sa_sigaction = on_sigterm;
  action.sa_flags = SA_SIGINFO;
  sigemptyset(&action.sa_mask);
  sigaction(SIGTERM, &action, nullptr);
}

}  // namespace anvil::parallel::mpi_detail
