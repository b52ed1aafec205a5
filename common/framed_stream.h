// A control connection on the io_context: frames (common/frame.h) read from one
// descriptor and written to another, or both on one socket.
//
// Reading feeds a FrameParser and hands each whole frame to the handler; sending puts
// the frame on one write queue, written in order, one write in flight at a time.
//
// Lifetime: the stream is owned by its user, and its handler (usually that same user)
// outlives it. After close() or destruction no handler method is called, not even for
// I/O already in flight: that I/O keeps the stream's buffers alive by itself. A handler
// may close or destroy the stream from inside any of its callbacks.
#pragma once

#include "common/frame.h"

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace elasticrun {

// Why a stream stopped reading (eof, read_error, bad_stream) or writing (write_error).
struct StreamEnd {
  enum class Kind { eof, read_error, bad_stream, write_error };
  Kind kind;
  std::string detail;  // the system's message, or why the bytes are not frames
};

struct FramedStreamOptions {
  std::uint32_t max_payload = kMaxFramePayload;
  std::size_t read_buffer = 65536;
};

class FramedStream {
 public:
  class Handler {
   public:
    // One whole frame.
    virtual void on_stream_frame(Frame f) = 0;
    // Reading ended: no frame follows (sends still work). Or a write failed: queued
    // frames are dropped and later sends ignored (reading goes on). Each at most once;
    // the stream stays open until its user closes it.
    virtual void on_stream_end(const StreamEnd& end) = 0;
    // The write queue ran empty: every frame sent so far is written.
    virtual void on_stream_drained() {}

   protected:
    ~Handler() = default;
  };

  using Options = FramedStreamOptions;

  // Takes ownership of the descriptors; they may be the same one (a socket).
  FramedStream(boost::asio::io_context& io, int read_fd, int write_fd, Handler& handler, Options options = {});
  // Takes over a connected socket.
  FramedStream(boost::asio::ip::tcp::socket socket, Handler& handler, Options options = {});
  ~FramedStream();
  FramedStream(const FramedStream&) = delete;
  FramedStream& operator=(const FramedStream&) = delete;

  // Starts reading.
  void start();
  void send(const Frame& f);
  // The largest payload accepted from now on (a larger one ends reading as bad_stream).
  void set_max_payload(std::uint32_t max_payload);
  // Reads no more: frames already received and not yet handed over are dropped.
  void stop_reading();
  // Closes the descriptors (shutting a socket down first, so that the peer sees the end
  // even where a copy of the descriptor lives on); drops what was not written yet.
  void close();
  bool closed() const;
  // Frames sent and not yet completely written, and their bytes (headers included).
  std::size_t queued() const;
  std::size_t queued_bytes() const;
  // The read descriptor, for socket options.
  int native_handle() const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace elasticrun
