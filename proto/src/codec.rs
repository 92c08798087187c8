//! The protobuf codec of every neardup service: prost's, except that a request that does not
//! parse is the caller's fault and answered INVALID_ARGUMENT (prost's codec says INTERNAL,
//! which would tell an operator to look for a bug in the server).

use std::marker::PhantomData;

use tonic::Status;
use tonic::codec::{BufferSettings, DecodeBuf, Decoder};
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

/// A [`tonic::codec::Codec`] for prost messages that maps parse errors to INVALID_ARGUMENT.
#[derive(Debug, Clone)]
pub struct Codec<T, U> {
    _pd: PhantomData<(T, U)>,
}

impl<T, U> Default for Codec<T, U> {
    fn default() -> Self {
        Codec { _pd: PhantomData }
    }
}

impl<T, U> tonic::codec::Codec for Codec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = MessageDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<T, U>::default().encoder()
    }

    fn decoder(&mut self) -> Self::Decoder {
        MessageDecoder { inner: ProstDecoder::default() }
    }
}

/// Decodes one prost message; a message that does not parse is INVALID_ARGUMENT.
#[derive(Debug, Clone)]
pub struct MessageDecoder<U> {
    inner: ProstDecoder<U>,
}

impl<U: prost::Message + Default> Decoder for MessageDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        self.inner.decode(buf).map_err(|s| {
            Status::invalid_argument(format!("the message does not parse: {}", s.message()))
        })
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.inner.buffer_settings()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::codec::Codec as _;

    #[test]
    fn round_trip_and_garbage() {
        use prost::Message;
        let msg = crate::v1::Match { id: "a".into(), fingerprint: 7, ..Default::default() };
        let bytes = msg.encode_to_vec();
        assert_eq!(crate::v1::Match::decode(bytes.as_slice()).unwrap(), msg);
        // The decoder is exercised over the wire in the router's and the tests' suites; here,
        // only that the codec builds for the generated types.
        let mut c = Codec::<crate::v1::Match, crate::v1::Match>::default();
        let _ = (c.encoder(), c.decoder());
    }
}
