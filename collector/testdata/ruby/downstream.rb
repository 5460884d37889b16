# A downstream service: answers each byte after 2 ms.
require "socket"
srv = TCPServer.new("127.0.0.1", Integer(ARGV[0]))
loop do
  c = srv.accept
  Thread.new(c) do |s|
    s.read(1)
    sleep 0.002
    s.write("y")
    s.close
  end
end
