import java.net.InetSocketAddress;
import java.nio.ByteBuffer;
import java.nio.channels.*;
import java.util.Iterator;

// A JDK NIO echo server on 127.0.0.1:PORT: one thread, its own selector
// loop (run), no framework.
public class NioEcho {
    public static void main(String[] args) throws Exception {
        Selector sel = Selector.open();
        ServerSocketChannel ss = ServerSocketChannel.open();
        ss.bind(new InetSocketAddress("127.0.0.1", Integer.parseInt(args[0])));
        ss.configureBlocking(false);
        ss.register(sel, SelectionKey.OP_ACCEPT);
        System.out.println("ready");
        run(sel, ByteBuffer.allocate(4096));
    }

    static void run(Selector sel, ByteBuffer buf) throws Exception {
        for (;;) {
            sel.select();
            Iterator<SelectionKey> it = sel.selectedKeys().iterator();
            while (it.hasNext()) {
                SelectionKey k = it.next();
                it.remove();
                if (k.isAcceptable()) {
                    SocketChannel c = ((ServerSocketChannel) k.channel()).accept();
                    c.configureBlocking(false);
                    c.register(sel, SelectionKey.OP_READ);
                } else if (k.isReadable()) {
                    SocketChannel c = (SocketChannel) k.channel();
                    buf.clear();
                    if (c.read(buf) < 0) { c.close(); continue; }
                    buf.flip();
                    while (buf.hasRemaining()) c.write(buf);
                }
            }
        }
    }
}
