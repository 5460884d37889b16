# A Rack app whose handlers wait on a Mutex, on a downstream socket and
# on the GVL (CPU-bound handlers in other threads), keeping their own
# clocks (GET /stats: seconds) for the recorder's to be checked against:
# off_KIND, each kind of handler's time off a CPU; lock_wait, the time
# taken to lock the Mutex.
require "socket"
require "json"

LOCK = Mutex.new
DOWN = ENV.fetch("DOWNSTREAM_PORT", "0").to_i

def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)
def cpu_now = Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID)

# Runs a handler's body, noting its time off a CPU (wall less its
# thread's CPU).
def timed(kind)
  w0, c0 = now, cpu_now
  yield
  note("off_#{kind}", (now - w0) - (cpu_now - c0))
end

# Each thread keeps its own sums (no lock of the app's but LOCK).
def note(key, secs)
  (Thread.current[:stats] ||= Hash.new(0.0))[key] += secs
end

def stats
  Thread.list.each_with_object(Hash.new(0.0)) do |t, sum|
    (t[:stats] || {}).each { |k, v| sum[k] += v }
  end
end

def lock_handler
  timed("lock") do
    t0 = now
    LOCK.synchronize do
      note("lock_wait", now - t0)
      sleep 0.002
    end
  end
end

def downstream_handler
  timed("down") do
    s = TCPSocket.new("127.0.0.1", DOWN)
    s.write("x")
    s.read(1)
    s.close
  end
end

def cpu_handler
  timed("cpu") do
    x = 0
    c0 = cpu_now
    x += 1 while cpu_now - c0 < 0.03
    note("on_cpu", cpu_now - c0)
    x
  end
end

run lambda { |env|
  case env["PATH_INFO"]
  when "/lock" then lock_handler
  when "/down" then downstream_handler
  when "/cpu" then cpu_handler
  when "/stats" then return [200, {"content-type" => "application/json"}, [stats.to_json]]
  end
  [200, {"content-type" => "text/plain"}, ["ok\n"]]
}
