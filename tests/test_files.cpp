// util/files.h and util/mmap.h against hostile paths: readers refuse what is not a regular file
// before it can block, writers replace their target only after a complete write and never touch
// a path they did not create, "same file" is device + inode, and a mapped file that shrinks
// underneath ends in one clear error instead of a crash.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "support.h"
#include "util/error.h"
#include "util/files.h"
#include "util/mmap.h"

namespace minfer {
namespace {

namespace fs = std::filesystem;

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

void write_text(const fs::path& p, const std::string& text) { std::ofstream(p, std::ios::binary) << text; }

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Everything in `dir` but the names given: what a writer left behind.
std::vector<std::string> other_entries(const fs::path& dir, const std::vector<std::string>& expected) {
  std::vector<std::string> extra;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (std::find(expected.begin(), expected.end(), name) == expected.end()) extra.push_back(name);
  }
  return extra;
}

TEST(Files, ReadersRefuseWhatIsNotARegularFileWithoutBlocking) {
  const fs::path dir = test::temp_dir("files-kinds");
  const fs::path fifo = dir / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  // A FIFO without a writer blocks a plain open() forever; these must return at once.
  EXPECT_NE(error_of([&] { read_file(fifo.string()); }).find("is a named pipe (FIFO)"), std::string::npos);
  EXPECT_NE(error_of([&] { map_file(fifo.string()); }).find("is a named pipe (FIFO)"), std::string::npos);
  EXPECT_NE(error_of([&] { read_file(dir.string()); }).find("is a directory"), std::string::npos);
  EXPECT_NE(error_of([&] { read_file("/dev/zero"); }).find("is a character device"), std::string::npos);
  EXPECT_NE(error_of([&] { read_file((dir / "missing").string()); }).find("No such file"), std::string::npos);
}

TEST(Files, ReadFileReadsExactlyAndRefusesOversizedFiles) {
  const fs::path dir = test::temp_dir("files-read");
  const std::string text = std::string("line one\n\0binary\xff", 18) + std::string(100000, 'x');
  write_text(dir / "a.txt", text);
  EXPECT_EQ(read_file((dir / "a.txt").string()), text);
  const std::string e = error_of([&] { read_file((dir / "a.txt").string(), 1000); });
  EXPECT_NE(e.find(std::to_string(text.size()) + " bytes is more than"), std::string::npos) << e;
  EXPECT_NE(e.find("(1000 bytes)"), std::string::npos) << e;
}

TEST(Files, SameFileMeansSameInodeThroughEverySpelling) {
  const fs::path dir = test::temp_dir("files-same");
  const fs::path in = dir / "in.gguf";
  write_text(in, "model");
  fs::create_symlink(in, dir / "link.gguf");
  fs::create_hard_link(in, dir / "hard.gguf");
  const fs::path cwd = fs::current_path();
  fs::current_path(dir);
  for (const std::string out : {in.string(), std::string("./in.gguf"), std::string("in.gguf"),
                                (dir / "." / "in.gguf").string(), (dir / "link.gguf").string(),
                                (dir / "hard.gguf").string()}) {
    const std::string e = error_of([&] { refuse_to_overwrite_inputs(out, {in.string()}); });
    EXPECT_NE(e.find("(same file)"), std::string::npos) << out << ": " << e;
  }
  fs::current_path(cwd);
  EXPECT_EQ(error_of([&] { refuse_to_overwrite_inputs((dir / "new.gguf").string(), {in.string()}); }), "");
  write_text(dir / "other.gguf", "model");  // equal bytes, another file
  EXPECT_EQ(error_of([&] { refuse_to_overwrite_inputs((dir / "other.gguf").string(), {in.string()}); }), "");
  EXPECT_EQ(slurp(in), "model");
}

TEST(Files, OutputFileReplacesTheTargetOnlyOnCommit) {
  const fs::path dir = test::temp_dir("files-out");
  const fs::path target = dir / "model.gguf";
  write_text(target, "old");
  ::chmod(target.c_str(), 0640);
  {
    OutputFile out(target.string());
    out.write("new bytes");
    EXPECT_EQ(slurp(target), "old");  // nothing visible before commit
    out.commit();
  }
  EXPECT_EQ(slurp(target), "new bytes");
  EXPECT_EQ(fs::status(target).permissions() & fs::perms::all, fs::perms(0640));
  EXPECT_EQ(other_entries(dir, {"model.gguf"}), std::vector<std::string>{});
  {
    OutputFile abandoned(target.string());  // an error before commit: the target stays as it was
    abandoned.write("half");
  }
  EXPECT_EQ(slurp(target), "new bytes");
  EXPECT_EQ(other_entries(dir, {"model.gguf"}), std::vector<std::string>{});
}

TEST(Files, OutputFileFollowsSymlinksAndRefusesNonRegularTargets) {
  const fs::path dir = test::temp_dir("files-link");
  fs::create_directory(dir / "real");
  write_text(dir / "real" / "model.gguf", "old");
  fs::create_symlink(dir / "real" / "model.gguf", dir / "link.gguf");
  {
    OutputFile out((dir / "link.gguf").string());
    out.write("new");
    out.commit();
  }
  EXPECT_TRUE(fs::is_symlink(dir / "link.gguf"));  // the link stays; the file it names is replaced
  EXPECT_EQ(slurp(dir / "real" / "model.gguf"), "new");

  for (const std::string target : {std::string("/dev/null"), std::string("/dev/full"), dir.string()}) {
    const std::string e = error_of([&] { OutputFile out(target); });
    EXPECT_NE(e.find("minfer reads and writes only regular files"), std::string::npos) << target << ": " << e;
  }
  EXPECT_TRUE(fs::is_character_file("/dev/null"));
  EXPECT_TRUE(fs::is_character_file("/dev/full"));
}

// In a child process (it lowers its own file size limit): a write past the limit must fail with
// the system's reason, leave `target` as it was and leave no temporary file. Exits 0 when so.
void write_past_the_file_size_limit(const fs::path& target, const std::string& original) {
  std::signal(SIGXFSZ, SIG_IGN);
  const rlimit limit{4096, 4096};
  setrlimit(RLIMIT_FSIZE, &limit);
  const std::string e = error_of([&] {
    OutputFile out(target.string());
    out.write(std::string(1 << 20, 'x'));
    out.commit();
  });
  std::fprintf(stderr, "%s\n", e.c_str());
  const bool ok = e.find("write failed: File too large") != std::string::npos && slurp(target) == original &&
                  other_entries(target.parent_path(), {target.filename().string()}).empty();
  std::exit(ok ? 0 : 1);
}

// A write error (here the file size limit, EFBIG) leaves the target untouched and no temporary file.
TEST(Files, OutputFileWriteErrorLosesNothing) {
  const fs::path target = test::temp_dir("files-efbig") / "model.gguf";
  write_text(target, "precious");
  EXPECT_EXIT(write_past_the_file_size_limit(target, "precious"), testing::ExitedWithCode(0), "");
}

// A process that has the old file mapped keeps reading the old bytes after a writer replaced it.
TEST(Files, ReplacingAMappedFileLeavesTheMappingIntact) {
  const fs::path dir = test::temp_dir("files-mapped");
  const fs::path path = dir / "model.gguf";
  const std::string old_bytes(1 << 16, 'a');
  write_text(path, old_bytes);
  const Mapping m = map_file(path.string());
  {
    OutputFile out(path.string());
    out.write(std::string(10, 'b'));
    out.commit();
  }
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(m.data), m.size), old_bytes);
  EXPECT_EQ(slurp(path), std::string(10, 'b'));
}

// Maps `path`, truncates it as another program could, and reads the lost last byte.
void read_truncated_mapping(const fs::path& path) {
  const Mapping m = map_file(path.string());
  fs::resize_file(path, 0);
  volatile uint8_t sink = m.data[m.size - 1];
  (void)sink;
  std::exit(0);  // not reached: the read faults
}

// Another program truncating a mapped file makes the lost pages raise SIGBUS; minfer reports it.
TEST(Files, TruncatedMappingIsOneClearErrorNotACrash) {
  const fs::path path = test::temp_dir("files-sigbus") / "model.gguf";
  write_text(path, std::string(1 << 16, 'a'));
  EXPECT_EXIT(read_truncated_mapping(path), testing::ExitedWithCode(1),
              "model.gguf: the file became shorter while minfer was reading it");
}

}  // namespace
}  // namespace minfer
